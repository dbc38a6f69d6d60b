"""The input is read as the user laid it out (issue 21, class 5).

Symlink loops end, a file reached twice is read once, derived ids name files relative to
input.path, a column first seen in a later row is kept, and input column types survive where
the output format can hold them. No model: the readers and the writer directly, and the whole
run with the echo engine of test_hostile_rows.
"""

from __future__ import annotations

import datetime
import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_hostile_rows import echo_engine, run_job, tokenizer  # noqa: F401  (fixtures)

from jobrunner.formats import input_files
from jobrunner.io.rundir import RunDir


def write(path: Path, recs: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def test_symlink_loops_end_and_a_file_reached_twice_is_read_once(tmp_path):
    data = tmp_path / "data"
    write(data / "a" / "x.jsonl", [{"id": "1", "prompt": "p"}])
    os.symlink(data, data / "a" / "loop")  # a loop back to the top
    os.symlink(data / "a" / "x.jsonl", data / "same.jsonl")  # the same file again
    for path in (str(data), f"{data}/**/*.jsonl", f"{data}/**"):
        assert input_files(path) == [str(data / "a" / "x.jsonl")], path


def test_a_recursive_glob_matches_as_glob_does(tmp_path):
    for name in ("a.jsonl", "d/b.jsonl", "d/e/c.jsonl", "d/.hidden.jsonl", "d/n.csv"):
        write(tmp_path / name, [{"id": name, "prompt": "p"}])
    got = [str(Path(f).relative_to(tmp_path)) for f in input_files(f"{tmp_path}/**/*.jsonl")]
    assert got == ["a.jsonl", "d/b.jsonl", "d/e/c.jsonl"]
    got = [str(Path(f).relative_to(tmp_path)) for f in input_files(f"{tmp_path}/d/**/*.jsonl")]
    assert got == ["d/b.jsonl", "d/e/c.jsonl"]


def test_derived_ids_name_files_relative_to_the_input_path(echo_engine, tmp_path):  # noqa: F811
    data = tmp_path / "data"
    for year in ("2024", "2025"):
        write(data / year / "part.jsonl", [{"prompt": "Say hi."}, {"prompt": "Say bye."}])
    code, summary, out = run_job(tmp_path, data, id_column=None)
    assert code == 0, summary
    ids = sorted(i for f in RunDir(out).shard_files() for i in _column(f, "id"))
    assert ids == [
        "2024/part.jsonl:0",
        "2024/part.jsonl:1",
        "2025/part.jsonl:0",
        "2025/part.jsonl:1",
    ]


def _column(f: Path, name: str) -> list:
    if f.suffix == ".parquet":
        return pq.read_table(f).column(name).to_pylist()
    return [json.loads(x).get(name) for x in f.read_text().splitlines()]


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_a_column_first_seen_in_a_later_row_is_kept(echo_engine, tmp_path, fmt):  # noqa: F811
    recs = [{"id": "a", "prompt": "Say hi."}, {"id": "b", "prompt": "Say bye.", "late": 7}]
    code, summary, out = run_job(tmp_path, write(tmp_path / "in.jsonl", recs), fmt)
    assert code == 0, summary
    (shard,) = RunDir(out).shard_files()
    rows = {r["id"]: r for r in _rows(shard)}
    assert rows["b"]["late"] == 7 and rows["a"].get("late") is None


def _rows(f: Path) -> list[dict]:
    if f.suffix == ".parquet":
        return pq.read_table(f).to_pylist()
    return [json.loads(x) for x in f.read_text().splitlines()]


def test_input_column_types_survive_in_parquet_and_an_integer_id_keeps_its_column(
    echo_engine,  # noqa: F811
    tmp_path,
):
    ts = datetime.datetime(2024, 5, 6, 7, 8, 9)
    table = pa.table(
        {
            "key": pa.array([10, 11], pa.int64()),
            "prompt": ["Say hi.", "Say bye."],
            "blob": pa.array([b"\x00\x01", b"\xff"]),
            "when": pa.array([ts, ts], pa.timestamp("us")),
            "huge": pa.array([2**64 - 1, 0], pa.uint64()),  # past int64: kept, as uint64
        }
    )
    pq.write_table(table, tmp_path / "in.parquet")
    code, summary, out = run_job(tmp_path, tmp_path / "in.parquet", "parquet", id_column="key")
    assert code == 0, summary
    (shard,) = RunDir(out).shard_files()
    got = pq.read_table(shard)
    assert got.schema.field("blob").type == pa.binary()
    assert got.schema.field("when").type == pa.timestamp("us")
    assert got.schema.field("key").type == pa.int64()  # the id column, with its type
    assert sorted(got.column("key").to_pylist()) == [10, 11]
    assert sorted(got.column("id").to_pylist()) == ["10", "11"]
    assert got.schema.field("huge").type == pa.uint64()  # the input's type (run_schema.py)
    assert sorted(got.column("huge").to_pylist()) == [0, 2**64 - 1]
