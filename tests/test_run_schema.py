"""One schema for every shard of a run (run_schema.py): results/ reads back as one table, Parquet
input columns keep their exact types and values, the schema survives a kill and a resume, and
JSONL output is strict JSON."""

from __future__ import annotations

import base64
import decimal
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from crashkit import start, write_job
from test_hostile_rows import echo_engine, tokenizer  # noqa: F401  (fixtures)
from typer.testing import CliRunner

from jobrunner.cli import app


def run_job(tmp: Path, inp: Path, fmt: str = "parquet", **output) -> Path:
    out = tmp / f"out-{fmt}"
    job = {
        "input": {"path": str(inp), "batch_rows": 1},
        "output": {"path": str(out), "format": fmt, "shard_rows": 1, **output},
        "engine": {"order_window": 1},
    }
    (tmp / "job.yaml").write_text(json.dumps(job))
    result = CliRunner().invoke(app, ["run", str(tmp / "job.yaml")])
    assert result.exit_code == 0, result.stdout
    return out


def shard_schemas(out: Path) -> list[pa.Schema]:
    return [pq.read_schema(f) for f in sorted((out / "results").glob("part-*.parquet"))]


@pytest.mark.usefixtures("echo_engine")
def test_jsonl_columns_of_mixed_types_have_one_type_in_every_shard(tmp_path):
    rows = [
        {"id": "a", "prompt": "hi", "score": 5},
        {"id": "b", "prompt": "yo", "score": "n/a"},
        {"id": "c", "prompt": "hey", "score": 2.5},
        {"id": "d", "prompt": "hm", "score": "5"},
    ]
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = run_job(tmp_path, inp)
    schemas = shard_schemas(out)
    assert len(schemas) == 4 and all(s.equals(schemas[0]) for s in schemas)
    table = pq.read_table(out / "results")  # the README's snippet: one dataset
    got = dict(zip(table["id"].to_pylist(), table["score"].to_pylist(), strict=True))
    assert got == {"a": "5", "b": '"n/a"', "c": "2.5", "d": '"5"'}  # JSON text: 5 is not "5"
    assert table.schema.field("prompt").type == pa.string()
    assert table.schema.field("prompt_tokens").type == pa.int64()


def exact_columns() -> dict[str, pa.Array]:
    ts = 1_700_000_000_123_456_789
    return {
        "ts": pa.array([ts, ts + 1, None, ts + 3], pa.timestamp("ns")),
        "clock": pa.array([1, 2, 3, None], pa.int64()).cast(pa.time64("ns")),
        "span": pa.array([None, 123_456_789, 7, 8], pa.duration("ns")),
        "money": pa.array(
            [decimal.Decimal("1.5"), decimal.Decimal("1234567890.0123456789"), None, 0],
            pa.decimal128(38, 10),
        ),
        "big": pa.array([2**64 - 1, 0, 2**63, None], pa.uint64()),
        "small": pa.array([-128, 0, None, 127], pa.int8()),
        "single": pa.array([1.1, None, float("inf"), -0.0], pa.float32()),
        "fixed": pa.array([b"ab", None, b"\xff\x00", b"zz"], pa.binary(2)),
        "long_list": pa.array([[1, 2], [], None, [3]], pa.large_list(pa.int32())),
        "late": pa.array([None, None, "x", "y"], pa.string()),  # all null in the first shards
    }


@pytest.mark.usefixtures("echo_engine")
def test_parquet_input_columns_come_back_type_and_value_exact(tmp_path):
    cols = exact_columns()
    inp = tmp_path / "in.parquet"
    pq.write_table(
        pa.table({"id": ["r0", "r1", "r2", "r3"], "prompt": ["a", "b", "c", "d"], **cols}), inp
    )
    out = run_job(tmp_path, inp)
    schemas = shard_schemas(out)
    assert len(schemas) == 4 and all(s.equals(schemas[0]) for s in schemas)
    table = pq.read_table(out / "results").sort_by("id")
    for name, want in cols.items():
        assert table.schema.field(name).type == want.type, name
        assert table[name].combine_chunks().equals(want), name


@pytest.mark.usefixtures("echo_engine")
def test_files_that_disagree_on_a_type_take_one_for_the_run(tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    files = [
        ("a", "n", pa.array([1], pa.int32())),
        ("b", "n", pa.array([2.5])),
        ("c", "u", pa.array([2**63], pa.uint64())),
        ("e", "u", pa.array([-1])),
    ]
    for k, (i, name, values) in enumerate(files):
        pq.write_table(pa.table({"id": [i], "prompt": [i], name: values}), d / f"{k}.parquet")
    out = run_job(tmp_path, d)
    schemas = shard_schemas(out)
    assert len(schemas) == 4 and all(s.equals(schemas[0]) for s in schemas)
    table = pq.read_table(out / "results").sort_by("id")
    assert table.schema.field("n").type == pa.float64()
    assert table["n"].to_pylist() == [1.0, 2.5, None, None]
    assert table.schema.field("u").type == pa.string()  # no integer type holds both: JSON text
    assert table["u"].to_pylist() == [None, None, str(2**63), "-1"]


def test_types_that_would_round_or_overflow_a_value_become_json_text():
    from jobrunner.formats.columns import infer_schema, is_json_text, unify

    def one(*types):
        return unify([pa.schema([("x", t)]) for t in types]).field("x")

    assert one(pa.int32(), pa.float64()).type == pa.float64()  # a double holds any int32
    assert is_json_text(one(pa.int64(), pa.float64()))  # 2**53 + 1 would round
    wide, signed = pa.struct([("a", pa.uint64())]), pa.struct([("a", pa.int64())])
    assert is_json_text(one(wide, signed))  # 2**63 in the nested field would overflow
    # pandas' Categorical: two files' int8 dictionaries may together outgrow int8
    assert one(pa.dictionary(pa.int8(), pa.string())).type == pa.string()
    # JSONL: ints seen to fit a double join a float chunk; larger ones do not
    assert infer_schema([{"x": 5}] * 4096 + [{"x": 2.5}]).field("x").type == pa.float64()
    big = [{"x": 2**53 + 1}] + [{"x": 1}] * 4095 + [{"x": 1.5}]
    assert is_json_text(infer_schema(big).field("x"))


@pytest.mark.usefixtures("echo_engine")
def test_a_start_refused_before_its_first_commit_keeps_no_schema(tmp_path, monkeypatch):
    """A large input is checked while the engine starts: a start refused for duplicate ids
    committed nothing, so the corrected input's columns decide the run's types."""
    import jobrunner.resume as resume

    monkeypatch.setattr(resume, "CHECK_WHILE_STARTING_ROWS", 1)  # as for 5M rows and more
    inp = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": ["a", "a"], "prompt": ["hi", "yo"], "x": [1, 2]}), inp)
    job = {"input": {"path": str(inp)}, "output": {"path": str(tmp_path / "out")}}
    (tmp_path / "job.yaml").write_text(json.dumps(job))
    assert CliRunner().invoke(app, ["run", str(tmp_path / "job.yaml")]).exit_code == 65
    pq.write_table(pa.table({"id": ["a", "b"], "prompt": ["hi", "yo"], "x": ["p", "q"]}), inp)
    result = CliRunner().invoke(app, ["run", str(tmp_path / "job.yaml")])
    assert result.exit_code == 0, result.stdout
    table = pq.read_table(tmp_path / "out" / "results")
    assert table.schema.field("x").type == pa.string() and table.num_rows == 2


@pytest.mark.usefixtures("echo_engine")
def test_jsonl_columns_are_typed_in_the_input_scan_without_a_second_read(tmp_path, monkeypatch):
    """At a run's first start the id scan reads every JSONL line anyway: it types the columns
    as it goes (a value past the first chunk of lines included), so the input is read once."""
    import dataclasses

    from jobrunner import formats
    from jobrunner.formats.jsonl import file_schema

    rows = [{"id": f"r{i}", "prompt": "hi", "score": i} for i in range(5000)]
    rows[4500]["score"] = "n/a"  # in the second chunk of 4,096 lines: JSON text for all
    rows[4700]["extra"] = [1, 2]  # a key only one late line has
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    expected = file_schema(str(inp))

    def second_read(file):
        raise AssertionError(f"{file} read again for its schema")

    jsonl = formats.FORMATS.get("jsonl")
    monkeypatch.setitem(
        formats.FORMATS._entries, "jsonl", dataclasses.replace(jsonl, schema=second_read)
    )
    out = tmp_path / "out"
    job = {"input": {"path": str(inp)}, "output": {"path": str(out), "shard_rows": 2500}}
    (tmp_path / "job.yaml").write_text(json.dumps(job))
    result = CliRunner().invoke(app, ["run", str(tmp_path / "job.yaml")])
    assert result.exit_code == 0, result.stdout
    table = pq.read_table(out / "results").sort_by("id")
    for name in ("prompt", "score"):
        assert table.schema.field(name).equals(expected.field(name), check_metadata=True)
    assert expected.field("extra").type == pa.list_(pa.int64())
    assert pa.types.is_list(table.schema.field("extra").type)  # (Parquet names its item)
    scores = dict(zip(table["id"].to_pylist(), table["score"].to_pylist(), strict=True))
    assert scores["r4500"] == '"n/a"' and scores["r7"] == "7"  # JSON text, over every line
    assert table["extra"].drop_null().to_pylist() == [[1, 2]]


def strict(line: str) -> dict:
    def refuse(token: str):
        raise ValueError(f"not JSON: {token}")

    return json.loads(line, parse_constant=refuse)


@pytest.mark.usefixtures("echo_engine")
def test_jsonl_output_is_strict_json(tmp_path):
    inp = tmp_path / "in.parquet"
    table = pa.table(
        {
            "id": ["a", "b"],
            "prompt": ["x", "y"],
            "f": [float("nan"), float("-inf")],
            "nested": [[float("inf")], [1.5]],
            "raw": pa.array([b"\xff\x00", None]),
        }
    )
    pq.write_table(table, inp)
    out = run_job(tmp_path, inp, "jsonl")
    rows = {
        r["id"]: r
        for f in sorted((out / "results").glob("part-*.jsonl"))
        for r in map(strict, f.read_text().splitlines())
    }
    assert rows["a"]["f"] is None and rows["b"]["f"] is None
    assert rows["a"]["nested"] == [None] and rows["b"]["nested"] == [1.5]
    assert base64.b64decode(rows["a"]["raw"]) == b"\xff\x00" and rows["b"]["raw"] is None


@pytest.mark.slow
def test_a_resumed_run_writes_its_later_shards_in_the_first_shards_schema(tmp_path):
    rows = [
        {"id": f"r{i}", "prompt": f"Say {i}.", "v": [i, str(i), None, i / 2][i % 4]}
        for i in range(8)
    ]
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    job = write_job(
        tmp_path,
        "paged",
        inp,
        output__format="parquet",
        output__shard_rows=1,
        engine__order_window=1,
        generation__max_new_tokens=2,
    )
    proc = start(job, JOBRUNNER_FAULT_KILL="after_manifest:3")
    proc.wait(timeout=600)
    assert proc.returncode == -9
    first = shard_schemas(tmp_path / "out")
    assert len(first) == 3
    done = start(job)
    assert done.wait(timeout=600) == 0, done.stderr.read()
    schemas = shard_schemas(tmp_path / "out")
    assert len(schemas) == 8 and all(s.equals(first[0]) for s in schemas)
    table = pq.read_table(tmp_path / "out" / "results").sort_by("id")
    assert table["v"].to_pylist() == [
        json.dumps(r["v"]) if r["v"] is not None else None for r in rows
    ]


def test_a_value_the_runs_schema_cannot_hold_fails_its_row_and_names_the_way_out(tmp_path):
    """A column's type is fixed at a run's first start: a later row (rows --retry-errors took
    in) whose value is of another type fails alone, and the message says how to retype."""
    from jobrunner.formats.parquet import write_parquet
    from jobrunner.io.rundir import split_unwritable

    schema = pa.schema([("id", pa.string()), ("x", pa.int64())])
    records = [{"id": "a", "x": 1}, {"id": "b", "x": "p"}]
    kept, failed = split_unwritable(
        records, "parquet", None, lambda recs, path: write_parquet(recs, path, schema)
    )
    assert kept == [records[0]] and [e.id for e in failed] == ["b"]
    assert failed[0].code == "unwritable" and "--restart types the columns anew" in (
        failed[0].message
    )
