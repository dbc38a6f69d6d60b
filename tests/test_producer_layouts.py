"""Inputs as other tools write them: Spark's and Dask's folders, pandas' and old Hive's Parquet.

Each case runs through the command line a user types (`validate`, which reads every row).
"""

from __future__ import annotations

import json
import logging

import pyarrow as pa
import pyarrow.parquet as pq
from typer.testing import CliRunner

from jobrunner.cli import app


def cli(*args):
    result = CliRunner().invoke(app, [str(a) for a in args])
    lines = result.stdout.strip().splitlines()
    return result, json.loads(lines[-1]) if lines else {}


def job(tmp_path, path, **input_keys):
    target = tmp_path / "job.yaml"
    inp = {"path": str(path), "prompt": {"template": "Say {text}"}, **input_keys}
    target.write_text(json.dumps({"input": inp, "output": {"path": str(tmp_path / "out")}}))
    return target


def spark_folder(root):
    """What Spark leaves in a folder it wrote, a failed attempt's file still in _temporary/."""
    rows = pa.table({"id": [1, 2], "text": ["a", "b"]})
    root.mkdir()
    pq.write_table(rows, root / "part-00000-c1.snappy.parquet")
    attempt = root / "_temporary" / "0" / "_temporary" / "attempt_202401010000_0001_m_000000_1"
    attempt.mkdir(parents=True)
    pq.write_table(rows, attempt / "part-00000-c1.snappy.parquet")
    (root / "_SUCCESS").write_text("")
    (root / ".part-00000-c1.snappy.parquet.crc").write_bytes(b"crc")
    (root / "._SUCCESS.crc").write_bytes(b"crc")
    pq.write_metadata(rows.schema, root / "_common_metadata")
    (root / ".hidden.parquet").write_bytes(b"not parquet at all")


def test_a_spark_folder_is_read_as_spark_reads_it(tmp_path, caplog):
    data = tmp_path / "data"
    spark_folder(data)
    caplog.set_level(logging.WARNING)
    for path in (data, f"{data}/**/*.parquet", f"{data}/*.parquet"):
        result, summary = cli("validate", job(tmp_path, path))
        assert result.exit_code == 0, result.stderr
        assert summary["valid"] == 2, summary  # not the failed attempt's rows again
    assert "_temporary/0/_temporary/attempt_202401010000_0001_m_000000_1/part-00000" in caplog.text
    assert "_SUCCESS" not in caplog.text and ".crc" not in caplog.text  # markers: no warning
    # derived ids would have made the attempt's rows new rows: each is read once
    result, summary = cli("validate", job(tmp_path, data, id_column=None))
    assert result.exit_code == 0 and summary["valid"] == 2, result.stderr
    # a path that names such a folder reads it
    result, summary = cli("validate", job(tmp_path, f"{data}/_temporary/**/*.parquet"))
    assert result.exit_code == 0 and summary["valid"] == 2, result.stderr


def test_a_hive_partition_folder_named_with_an_underscore_is_data(tmp_path):
    data = tmp_path / "data"
    for part in ("_c0=1", "_c0=2"):
        (data / part).mkdir(parents=True)
        pq.write_table(pa.table({"id": [part], "text": ["a"]}), data / part / "part-0.parquet")
    result, summary = cli("validate", job(tmp_path, data))
    assert result.exit_code == 0 and summary["valid"] == 2, result.stderr


def run_job(tmp_path, path, prompt, *args):
    target = tmp_path / "job.yaml"
    target.write_text(
        json.dumps(
            {
                "input": {"path": str(path), "prompt": prompt, "max_error_rate": 0.5},
                "generation": {"max_new_tokens": 2},
                "output": {"path": str(tmp_path / "out")},
            }
        )
    )
    return cli("run", target, *args)


def test_binary_text_columns_are_their_utf8_text_in_prompts(tmp_path):
    """Hive, Impala and older Spark write strings as Parquet BINARY: the prompt is the text,
    never Python's b'...' repr, and bytes that are not UTF-8 fail their row, naming the field."""
    texts = ["hello there", "général ✓"]
    as_text, as_binary = tmp_path / "text.parquet", tmp_path / "binary.parquet"
    pq.write_table(pa.table({"id": [1, 2], "text": texts}), as_text)
    binary = pa.array([t.encode() for t in texts] + [b"\xff\xfe"], pa.binary())
    pq.write_table(pa.table({"id": [1, 2, 3], "text": binary}), as_binary)
    template = {"template": "Say {text}"}
    _, want = cli("validate", job(tmp_path, as_text))
    result, got = cli("validate", job(tmp_path, as_binary, max_error_rate=0.5))
    assert result.exit_code == 0, result.stderr
    assert got["prompt_tokens"] == want["prompt_tokens"], (got, want)
    assert "invalid_utf8: " in result.stderr and "row 2: template field {text} is binary" in (
        result.stderr
    )
    result, summary = run_job(tmp_path, as_binary, template)
    assert result.exit_code == 0, result.stderr
    assert summary["rows"] == {"succeeded": 2, "failed": 1, "skipped": 0}
    out = pq.read_table(tmp_path / "out" / "results")
    assert out.schema.field("text").type == pa.binary()  # the input column keeps its type
    assert sorted(out.column("text").to_pylist()) == sorted(t.encode() for t in texts)
    (error,) = [
        json.loads(x) for x in (tmp_path / "out" / "errors.jsonl").read_text().split("\n") if x
    ]
    assert (error["id"], error["code"], error["field"], error["row"]) == (
        "3",
        "invalid_utf8",
        "text",
        2,
    )
    result, summary = run_job(tmp_path, as_binary, template)
    assert result.exit_code == 0 and summary["status"] == "nothing_to_do", result.stderr


def test_a_binary_prompt_column_is_its_utf8_text(tmp_path):
    data = tmp_path / "binary.parquet"
    binary = pa.array([b"hello there", b"\xc3"], pa.binary())
    pq.write_table(pa.table({"id": ["a", "b"], "prompt": binary}), data)
    target = tmp_path / "job.yaml"
    target.write_text(json.dumps({"input": {"path": str(data), "max_error_rate": 0.5}}))
    result, summary = cli("validate", target)
    assert result.exit_code == 0 and summary["valid"] == 1, result.stderr
    assert "invalid_utf8: " in result.stderr
    assert "row 1: the prompt column 'prompt' is binary and not UTF-8 text" in result.stderr


def test_init_on_pandas_columns_with_spaces_and_dots_writes_a_job_that_runs(tmp_path):
    """Spreadsheet and Kaggle exports name columns `Review Text`; pandas adds its index and
    writes Categoricals as dictionaries. `init` makes a template over them that runs, and the
    results keep every input column."""
    import pandas as pd

    df = pd.DataFrame(
        {
            "Review Text": ["Soft fabric.", "Too small."],
            "user.name": ["ann", "bob"],
            "Department": pd.Categorical(["Tops", "Dresses"]),
        },
        index=[7, 9],
    )
    data = tmp_path / "reviews.parquet"
    df.to_parquet(data)
    result, _ = cli("init", data)
    assert result.exit_code == 0, result.stderr
    target = tmp_path / "reviews.yaml"
    assert "{Review Text}" in target.read_text() and "{user.name}" in target.read_text()
    args = ("--set", "generation.max_new_tokens=2", "--set", "engine.max_num_seqs=2")
    result, summary = cli("run", target, *args)
    assert result.exit_code == 0, result.stderr
    assert summary["rows"] == {"succeeded": 2, "failed": 0, "skipped": 0}
    out = pq.read_table(tmp_path / "out" / "reviews" / "results").sort_by("__index_level_0__")
    assert out.column("Review Text").to_pylist() == ["Soft fabric.", "Too small."]
    assert out.column("user.name").to_pylist() == ["ann", "bob"]
    assert out.column("Department").to_pylist() == ["Tops", "Dresses"]
    assert out.column("__index_level_0__").to_pylist() == [7, 9]
    result, summary = cli("run", target, *args)
    assert result.exit_code == 0 and summary["status"] == "nothing_to_do", result.stderr


def test_init_takes_a_binary_text_column_for_the_prompt(tmp_path):
    data = tmp_path / "hive.parquet"
    body = pa.array([b"Soft fabric.", "Trop petit \u2713".encode()], pa.binary())
    pq.write_table(pa.table({"id": [1, 2], "body": body}), data)
    result, _ = cli("init", data)
    assert result.exit_code == 0, result.stderr
    assert "{body}" in (tmp_path / "hive.yaml").read_text()
    result, summary = cli("validate", tmp_path / "hive.yaml")
    assert result.exit_code == 0 and summary["valid"] == 2, result.stderr


def test_a_hive_partition_key_is_a_column_unless_partition_columns_is_false(tmp_path):
    data = tmp_path / "data"
    for day in ("2024-01-01", "2024-01-02"):
        (data / f"date={day}").mkdir(parents=True)
        pq.write_table(pa.table({"text": ["a"]}), data / f"date={day}" / "part-0.parquet")
    target = job(tmp_path, data, id_column=None)
    target.write_text(target.read_text().replace("Say {text}", "Say {text} on {date}"))
    result, summary = cli("validate", target)
    assert result.exit_code == 0 and summary["valid"] == 2, result.stderr
    result, summary = cli("validate", target, "--set", "input.partition_columns=false")
    assert result.exit_code == 78, result.stderr
    (line,) = summary["error"].splitlines()  # once, not once per partition folder
    assert (
        "template field {date} is not a column; columns: text; date is a Hive partition key" in line
    )


def test_int96_timestamps_past_2262_keep_their_dates(tmp_path):
    """Spark, Hive and Impala write timestamps as INT96; a warehouse's open end 9999-12-31
    stays that date in the results, not a date wrapped round in nanoseconds."""
    import datetime

    data = tmp_path / "scd.parquet"
    ends = [datetime.datetime(2024, 5, 1, 12, 30, 0, 123456), datetime.datetime(9999, 12, 31)]
    table = pa.table(
        {"id": [1, 2], "text": ["a", "b"], "valid_to": pa.array(ends, pa.timestamp("us"))}
    )
    pq.write_table(table, data, use_deprecated_int96_timestamps=True)
    result, summary = run_job(tmp_path, data, {"template": "Say {text} until {valid_to}"})
    assert result.exit_code == 0, result.stderr
    out = pq.read_table(tmp_path / "out" / "results").sort_by("input_id")
    assert out.column("valid_to").to_pylist() == ends


def test_two_parquet_columns_of_one_name_are_65_naming_them(tmp_path):
    data = tmp_path / "dup.parquet"
    columns = [pa.array([1, 2]), pa.array(["a", "b"]), pa.array(["c", "d"])]
    pq.write_table(pa.Table.from_arrays(columns, names=["id", "text", "text"]), data)
    result, summary = cli("validate", job(tmp_path, data))
    assert result.exit_code == 65, result.stderr
    assert summary["error"] == (
        f"{data}: the column name 'text' is used by 2 columns (a row would keep one of their"
        " values); rename them apart and run again"
    )


def test_uuid_ids_run_and_resume(tmp_path):
    """A UUID id column (DuckDB, Iceberg) runs, keeps its type among the input columns, and a
    rerun finds every row done."""
    import uuid

    ids = [uuid.uuid4() for _ in range(3)]
    data = tmp_path / "duck.parquet"
    table = pa.table({"id": pa.array([u.bytes for u in ids], pa.uuid()), "text": ["a", "b", "c"]})
    pq.write_table(table, data)
    result, summary = run_job(tmp_path, data, {"template": "Say {text}"})
    assert result.exit_code == 0, result.stderr
    assert summary["rows"] == {"succeeded": 3, "failed": 0, "skipped": 0}
    out = pq.read_table(tmp_path / "out" / "results")
    assert sorted(out.column("id").to_pylist()) == sorted(str(u) for u in ids)
    assert sorted(out.column("input_id").to_pylist()) == sorted(ids)
    result, summary = run_job(tmp_path, data, {"template": "Say {text}"})
    assert result.exit_code == 0 and summary["status"] == "nothing_to_do", result.stderr


def test_a_column_added_in_later_files_runs_their_rows_and_fails_the_older_ones(tmp_path, caplog):
    """A dataset whose schema grew (Spark's mergeSchema reads the older files' rows as null):
    a template over the new column runs the rows that have it; the older files' rows fail
    alone, each named, as rows whose value is null do; a named id column stays per file."""
    data = tmp_path / "data"
    data.mkdir()
    pq.write_table(
        pa.table({"id": pa.array([1, 2], pa.int32()), "text": ["a", "b"]}), data / "part-0.parquet"
    )
    later = {"id": pa.array([3, 4], pa.int64()), "text": ["c", "d"], "lang": ["en", "fr"]}
    pq.write_table(pa.table(later), data / "part-1.parquet")
    caplog.set_level(logging.WARNING)
    result, summary = run_job(tmp_path, data, {"template": "Say {text} in {lang}"})
    assert result.exit_code == 0, result.stderr
    assert summary["rows"] == {"succeeded": 2, "failed": 2, "skipped": 0}
    assert "column 'lang' is missing from 1 of the 2 input files checked" in caplog.text
    errors = [json.loads(x) for x in (tmp_path / "out" / "errors.jsonl").read_text().splitlines()]
    assert sorted((e["id"], e["code"], e["field"], e["row"]) for e in errors) == [
        ("1", "missing_field", "lang", 0),
        ("2", "missing_field", "lang", 1),
    ]
    out = pq.read_table(tmp_path / "out" / "results")
    assert sorted(out.column("lang").to_pylist()) == ["en", "fr"]
    assert out.schema.field("input_id").type == pa.int64()  # int32 + int64: int64
    result, summary = run_job(tmp_path, data, {"template": "Say {text} in {lang}"})
    assert result.exit_code == 0 and summary["status"] == "nothing_to_do", result.stderr
    # a column no file has is still the configuration error it was
    result, summary = run_job(tmp_path, data, {"template": "Say {text} in {lnag}"})
    assert result.exit_code == 78 and "template field {lnag} is not a column" in summary["error"]


def test_a_hive_table_folder_of_files_without_a_suffix_runs_with_input_format(tmp_path, caplog):
    """Hive names its files 000000_0 and stages writes in .hive-staging_*: with input.format
    naming the format, the folder's bare files are read and the staging copy is not."""
    data = tmp_path / "table"
    staging = data / ".hive-staging_hive_2024-01-01_00-00-00_000_1" / "-ext-10000"
    staging.mkdir(parents=True)
    pq.write_table(pa.table({"id": [1, 2], "text": ["a", "b"]}), data / "000000_0")
    pq.write_table(pa.table({"id": [3], "text": ["c"]}), data / "000001_0")
    pq.write_table(pa.table({"id": [3], "text": ["c"]}), staging / "000001_0")
    caplog.set_level(logging.WARNING)
    result, summary = cli("validate", job(tmp_path, data))
    assert result.exit_code == 65, result.stderr  # auto: no suffix, no format to read them as
    assert "are read when input.format names one" in caplog.text
    target = tmp_path / "job.yaml"
    body = json.loads(target.read_text())
    body["input"]["format"] = "parquet"
    body["generation"] = {"max_new_tokens": 2}
    target.write_text(json.dumps(body))
    result, summary = cli("run", target)
    assert result.exit_code == 0, result.stderr
    assert summary["rows"] == {"succeeded": 3, "failed": 0, "skipped": 0}
    result, summary = cli("run", target)
    assert result.exit_code == 0 and summary["status"] == "nothing_to_do", result.stderr


def test_chat_messages_as_spark_maps_are_read_as_objects(tmp_path):
    """Spark writes a message inferred from a Python dict as map<string,string>: the same
    prompt as a list of structs, and the column keeps its map type in the results."""
    turns = [[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]]
    as_structs, as_maps = tmp_path / "structs.parquet", tmp_path / "maps.parquet"
    pq.write_table(pa.table({"id": [1], "messages": turns}), as_structs)
    map_type = pa.list_(pa.map_(pa.string(), pa.string()))
    maps = pa.array([[list(m.items()) for m in t] for t in turns], map_type)
    pq.write_table(pa.table({"id": [1], "messages": maps}), as_maps)
    prompt = {"messages_column": "messages"}
    _, want = cli("validate", job(tmp_path, as_structs, prompt=prompt))
    result, got = cli("validate", job(tmp_path, as_maps, prompt=prompt))
    assert result.exit_code == 0, result.stderr
    assert got["prompt_tokens"] == want["prompt_tokens"]
    result, summary = run_job(tmp_path, as_maps, prompt)
    assert result.exit_code == 0 and summary["rows"]["succeeded"] == 1, result.stderr
    out = pq.read_table(tmp_path / "out" / "results")
    assert out.schema.field("messages").type == map_type


def test_pandas_float_ids_say_why_they_are_floats(tmp_path):
    import pandas as pd

    data = tmp_path / "ids.parquet"
    pd.DataFrame({"id": [1, 2, None], "text": ["a", "b", "c"]}).to_parquet(data)
    result, summary = cli("validate", job(tmp_path, data))
    assert result.exit_code == 65, result.stderr
    assert (
        f"{data}:row 1: id 'id' must be a string or integer, got the float 2.0 (pandas stores"
        " integers with a missing value as float64: write the ids as pandas' Int64 or as strings)"
    ) in result.stderr
    assert f"{data}:row 2: the id column 'id' is null or missing" in result.stderr


def test_a_hive_file_of_binary_ids_and_text_runs_and_resumes(tmp_path):
    data = tmp_path / "impala.parquet"
    ids = pa.array([b"doc-1", b"doc-2", b"\xff"], pa.binary())
    text = pa.array([b"first", b"second", b"third"], pa.binary())
    pq.write_table(pa.table({"id": ids, "text": text}), data)
    result, summary = run_job(tmp_path, data, {"template": "Say {text}"})
    assert result.exit_code == 0, result.stderr
    assert summary["rows"] == {"succeeded": 2, "failed": 1, "skipped": 0}
    out = pq.read_table(tmp_path / "out" / "results")
    assert sorted(out.column("id").to_pylist()) == ["doc-1", "doc-2"]
    assert out.schema.field("input_id").type == pa.binary()  # the input column, as it was
    (error,) = [json.loads(x) for x in (tmp_path / "out" / "errors.jsonl").read_text().splitlines()]
    assert (error["code"], error["field"], error["row"]) == ("invalid_utf8", "id", 2)
    result, summary = run_job(tmp_path, data, {"template": "Say {text}"})
    assert result.exit_code == 0 and summary["status"] == "nothing_to_do", result.stderr
