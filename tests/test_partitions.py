"""Hive partition folders as columns (`country=de/dt=2024-01-01/part-0.parquet`), as pandas,
pyarrow.dataset, Spark and DuckDB read a partitioned table, through the commands a user types.

`validate`, `estimate` and `init` load no model; one run (the real built-in model, two tokens a
row) shows the columns kept in the results, typed in the run's schema, and the run resuming.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from jobrunner.cli import app
from jobrunner.config import JobConfig

DAYS = ("2024-01-01", "2024-01-02")


def cli(*args):
    result = CliRunner().invoke(app, [str(a) for a in args])
    lines = result.stdout.strip().splitlines()
    return result, json.loads(lines[-1]) if lines else {}


def job(tmp_path, path, template="Say {text} in {country} on {dt}", **input_keys):
    target = tmp_path / "job.yaml"
    inp = {"path": str(path), "prompt": {"template": template}, **input_keys}
    spec = {
        "input": inp,
        "generation": {"max_new_tokens": 2},
        "output": {"path": str(tmp_path / "out")},
    }
    target.write_text(json.dumps(spec))
    return target


def parquet_table(root, countries=("de", "fr"), days=DAYS, **extra):
    """Two rows in each `country=C/dt=D/part-0.parquet`; `extra`: more columns of the files."""
    for c in countries:
        for d in days:
            folder = root / f"country={c}" / f"dt={d}"
            folder.mkdir(parents=True)
            cols = {"id": [f"{c}-{d}-{i}" for i in range(2)], "text": ["a", "b"]}
            cols |= {k: [v, v] for k, v in extra.items()}
            pq.write_table(pa.table(cols), folder / "part-0.parquet")
    return root


def jsonl_table(root, countries=("de", "fr")):
    for c in countries:
        folder = root / f"country={c}" / f"dt={DAYS[0]}"
        folder.mkdir(parents=True)
        lines = [json.dumps({"id": f"{c}-{i}", "text": t}) for i, t in enumerate("ab")]
        (folder / "part-0.jsonl").write_text("\n".join(lines) + "\n")
    return root


def test_partition_keys_are_columns_a_template_reads_in_parquet_and_jsonl_folders(tmp_path):
    parquet, lines = parquet_table(tmp_path / "pq"), jsonl_table(tmp_path / "jl")
    for path, rows in ((parquet, 8), (f"{parquet}/*/dt=*/*.parquet", 8), (lines, 4)):
        result, summary = cli("validate", job(tmp_path, path))
        assert result.exit_code == 0, result.stderr
        assert (summary["rows"], summary["valid"]) == (rows, rows), summary
        result, summary = cli("estimate", job(tmp_path, path))
        assert result.exit_code == 0 and summary["rows"] == rows, result.stderr
    # the prompt holds the folder's value: a longer value, more prompt tokens
    _, short = cli("validate", job(tmp_path, lines, "{country}"))
    renamed = tmp_path / "jl" / "country=de"
    renamed.rename(tmp_path / "jl" / "country=Deutschland, Schweiz und Österreich")
    _, long = cli("validate", job(tmp_path, lines, "{country}"))
    assert long["prompt_tokens"] > short["prompt_tokens"] + 2, (short, long)


def test_partition_columns_are_kept_as_text_in_the_results_and_a_run_resumes(tmp_path):
    """Values stay their folder's text ('007', the date), URL-decoded; Hive's default partition
    is null; the run's schema types them as strings; a rerun has nothing to do."""
    root = tmp_path / "lake"
    parquet_table(
        root, countries=("007", "a%2Fb%3Dc"), days=(DAYS[0], "__HIVE_DEFAULT_PARTITION__")
    )
    target = job(tmp_path, root, "Say {text} in {country}")
    result, summary = cli("run", target)
    assert result.exit_code == 0, result.stderr
    out = pq.read_table(tmp_path / "out" / "results")
    assert out.schema.field("country").type == pa.string()
    assert out.schema.field("dt").type == pa.string()
    got = sorted(tuple(r.values()) for r in out.select(["id", "country", "dt"]).to_pylist())
    assert got[:4] == [
        ("007-2024-01-01-0", "007", "2024-01-01"),
        ("007-2024-01-01-1", "007", "2024-01-01"),
        ("007-__HIVE_DEFAULT_PARTITION__-0", "007", None),
        ("007-__HIVE_DEFAULT_PARTITION__-1", "007", None),
    ]
    assert {c for _, c, _ in got} == {"007", "a/b=c"}
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    columns = manifest["schema"]["columns"]
    assert (columns["country"], columns["dt"]) == ("string", "string")
    result, summary = cli("run", target)
    assert result.exit_code == 0 and summary["status"] == "nothing_to_do", result.stderr


def test_init_on_a_partitioned_folder_lists_its_partition_columns(tmp_path):
    root = parquet_table(tmp_path / "reviews")
    result, _ = cli("init", root)
    assert result.exit_code == 0, result.stderr
    text = (tmp_path / "reviews.yaml").read_text()
    assert "# columns found: id, text, country, dt" in text
    assert json.loads(text.split("path: ", 1)[1].split()[0]) == "reviews"
    result, summary = cli("validate", tmp_path / "reviews.yaml")
    assert result.exit_code == 0 and summary["valid"] == 8, result.stderr


def test_a_file_column_named_as_its_partition_key_is_65_unless_partition_columns_is_false(
    tmp_path,
):
    root = parquet_table(tmp_path / "lake", countries=("de",), country="Germany")
    result, summary = cli("validate", job(tmp_path, root))
    assert result.exit_code == 65, result.stderr
    file = root / "country=de" / f"dt={DAYS[0]}" / "part-0.parquet"
    assert summary["error"].startswith(f"{file}:row 0: holds a column 'country', which is also")
    assert "input.partition_columns: false" in summary["error"]
    result, summary = cli("validate", job(tmp_path, root, partition_columns=False, id_column=None))
    assert result.exit_code == 78, result.stderr  # {dt} is no column now
    assert "template field {dt} is not a column; columns: id, text, country;" in summary["error"]
    assert "input.partition_columns is false" in summary["error"]
    result, summary = cli(
        "validate", job(tmp_path, root, "{text} {country}", partition_columns=False)
    )
    assert result.exit_code == 0 and summary["valid"] == 4, result.stderr
    # a JSONL row holding such a key: 65 naming its line
    lines = jsonl_table(tmp_path / "jl", countries=("de",))
    part = lines / "country=de" / f"dt={DAYS[0]}" / "part-0.jsonl"
    part.write_text(part.read_text() + '{"id": "x", "text": "c", "dt": "2023"}\n')
    result, summary = cli("validate", job(tmp_path, lines))
    assert result.exit_code == 65, result.stderr
    assert summary["error"].startswith(f"{part}:line 3: holds a column 'dt'"), summary


def test_files_without_a_partition_key_fail_their_rows_not_the_job(tmp_path, caplog):
    root = parquet_table(tmp_path / "lake", countries=("de",), days=DAYS[:1])
    pq.write_table(pa.table({"id": ["x", "y"], "text": ["c", "d"]}), root / "loose.parquet")
    result, summary = cli("validate", job(tmp_path, root, "{text} {country}", max_error_rate=0.9))
    assert result.exit_code == 0, result.stderr
    assert (summary["valid"], summary["errors_by_code"]) == (2, {"missing_field": 2}), summary
    assert "loose.parquet:row 0: template fields missing or null: ['country']" in result.stderr


def test_a_file_or_folder_named_by_input_path_gives_no_partition_columns(tmp_path):
    root = parquet_table(tmp_path / "lake", countries=("de",))
    folder = root / "country=de"
    for path in (folder / f"dt={DAYS[0]}" / "part-0.parquet", folder):
        result, summary = cli("validate", job(tmp_path, path, "{text} {country}"))
        assert result.exit_code == 78, result.stderr
        assert (
            "country is a Hive partition key (country=... folders) above the input root"
            in (summary["error"])
        )
    # the folders below it still are: dt
    result, summary = cli("validate", job(tmp_path, folder, "{text} {dt}"))
    assert result.exit_code == 0 and summary["valid"] == 4, result.stderr


def test_an_id_column_may_be_a_partition_key(tmp_path):
    """The vectorized id scan takes the id from the folder as the rows do: one row a file runs,
    two rows of one folder are duplicate ids."""
    root = tmp_path / "docs"
    for k in ("a", "b"):
        (root / f"doc={k}").mkdir(parents=True)
        pq.write_table(pa.table({"text": [k]}), root / f"doc={k}" / "part-0.parquet")
    result, summary = cli("validate", job(tmp_path, root, "{text}", id_column="doc"))
    assert result.exit_code == 0 and summary["valid"] == 2, result.stderr
    pq.write_table(pa.table({"text": ["c", "d"]}), root / "doc=a" / "part-0.parquet")
    result, summary = cli("validate", job(tmp_path, root, "{text}", id_column="doc"))
    assert result.exit_code == 65 and "duplicate" in summary["error"], summary


def test_ray_blocks_carry_their_partition_columns_to_the_worker(tmp_path):
    """What a Ray worker reads of each block (Parquet ranges, JSONL spans, CSV rows) has the
    columns a local run's rows have."""
    from jobrunner.executors.ray_blocks import plan_blocks, unpack_block

    csv_root = tmp_path / "csv" / "country=de" / f"dt={DAYS[0]}"
    csv_root.mkdir(parents=True)
    (csv_root / "part-0.csv").write_text("id,text\nc1,a\nc2,b\n")
    inputs = {
        "parquet": parquet_table(tmp_path / "pq"),
        "jsonl": jsonl_table(tmp_path / "jl"),
        "csv": tmp_path / "csv",
    }
    for kind, root in inputs.items():
        spec = {"input": {"path": str(root), "prompt": {"template": "{text} {country} {dt}"}}}
        plan = plan_blocks(JobConfig.model_validate(spec), set(), 3)
        rows = [r for b in plan.blocks for r in unpack_block(b["payload"])[0]]
        assert rows and all(r.values["country"] in ("de", "fr") for r in rows), kind
        assert {r.values["dt"] for r in rows} <= set(DAYS), kind
        assert all(r.values["id"].startswith(r.values["country"]) for r in rows if kind != "csv")


@pytest.mark.parametrize(
    "name, input_keys", [("a.tsv", {}), ("a.csv", {"delimiter": "\t"})], ids=["tsv", "delimiter"]
)
def test_a_partitioned_folder_of_tab_separated_files_reads_its_separator_and_folders(
    tmp_path, name, input_keys
):
    """`country=de/a.tsv`: each file cut by tabs (its suffix, or input.delimiter) though its
    header holds a comma, each row with its folder's column, in validate and the Ray blocks."""
    from jobrunner.executors.ray_blocks import plan_blocks, unpack_block

    root = tmp_path / "t"
    for c in ("de", "fr"):
        (root / f"country={c}").mkdir(parents=True)
        rows = f"id\tnote, short\ttext\n{c}-0\tx\tone, two\n{c}-1\ty\tthree\n"
        (root / f"country={c}" / name).write_text(rows)
    target = job(tmp_path, root, "Say {text} in {country}", **input_keys)
    result, summary = cli("validate", target)
    assert result.exit_code == 0, result.stdout
    assert (summary["rows"], summary["valid"]) == (4, 4), summary
    plan = plan_blocks(JobConfig.model_validate_json(target.read_text()), set(), 3)
    got = [r.values for b in plan.blocks for r in unpack_block(b["payload"])[0]]
    assert got == [
        {"id": f"{c}-{i}", "note, short": note, "text": text, "country": c}
        for c in ("de", "fr")
        for i, note, text in ((0, "x", "one, two"), (1, "y", "three"))
    ]


def test_the_ray_driver_refuses_a_parquet_column_named_as_a_partition_key(tmp_path):
    """Before any block runs: a worker's failure would not be the user's 65."""
    from jobrunner.errors import InputDataError
    from jobrunner.executors.ray_blocks import plan_blocks

    root = parquet_table(tmp_path / "lake", countries=("de",), dt="2020")
    spec = {"input": {"path": str(root), "prompt": {"template": "{text}"}}}
    with pytest.raises(InputDataError, match="holds a column 'dt', which is also a partition key"):
        plan_blocks(JobConfig.model_validate(spec), set(), 3)


def test_a_store_prefix_is_read_with_its_partition_columns(s3_env, tmp_path):
    from jobrunner.io import fs as store

    f, p = store.filesystem(s3_env)
    for c in ("de", "fr"):
        with f.open(f"{p}/reviews/country={c}/dt={DAYS[0]}/part-0.parquet", "wb") as out:
            pq.write_table(pa.table({"id": [c], "text": ["a"]}), out)
    for path in (f"{s3_env}/reviews/", f"{s3_env}/reviews/*/*/*.parquet"):
        result, summary = cli("validate", job(tmp_path, path))
        assert result.exit_code == 0 and summary["valid"] == 2, result.stderr
