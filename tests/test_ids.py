"""Compact row ids: the committed set and the duplicate check hold 8 bytes a row, and give the
same answers as the per-row rules (Preparer.row_id)."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobrunner.config import JobConfig
from jobrunner.io.ids import IdSet, batch_ids, committed
from jobrunner.resume import describe_duplicates, scan_ids


def test_idset_membership_by_batch():
    done = IdSet.of(["a", "b", "c"])
    assert len(done) == 3 and "b" in done and "z" not in done
    assert committed(done, ["c", None, "q", "a"]) == [True, False, False, True]
    assert committed(IdSet(), ["a"]) == [False]
    assert done.hashes.dtype.itemsize == 8


def test_batch_ids_follow_the_row_id_rules():
    batch = pa.record_batch({"id": ["x", None, "  ", "y"], "prompt": ["p"] * 4})
    assert batch_ids(batch, "d/f.parquet", 0, "id").to_pylist() == ["x", None, None, "y"]
    ints = pa.record_batch({"id": [7, 8]})
    assert batch_ids(ints, "f.parquet", 0, "id").to_pylist() == ["7", "8"]
    floats = pa.record_batch({"id": [1.5, 2.5]})
    assert batch_ids(floats, "f.parquet", 0, "id").to_pylist() == [None, None]
    plain = pa.record_batch({"prompt": ["p", "q"]})
    assert batch_ids(plain, "d/f.parquet", 10, "id").to_pylist() == [
        "d/f.parquet:10",
        "d/f.parquet:11",
    ]


def write_rows(path, rows: list[dict]) -> None:
    if path.suffix == ".parquet":
        pq.write_table(pa.Table.from_pylist(rows), path)
    elif path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:
        path.write_text("id,prompt\n" + "".join(f"{r['id']},{r['prompt']}\n" for r in rows))


def _cfg(path) -> JobConfig:
    return JobConfig.model_validate({"input": {"path": str(path)}})


def test_scan_finds_duplicates_in_parquet_with_places(tmp_path):
    ids = [f"r{i}" for i in range(1000)] + ["r5", "r999", None]
    pq.write_table(pa.table({"id": ids, "prompt": ["p"] * len(ids)}), tmp_path / "a.parquet")
    total, dups = scan_ids(_cfg(tmp_path / "a.parquet"))
    assert total == 1003
    assert dups == {
        "r5": ["a.parquet:row 5", "a.parquet:row 1000"],
        "r999": ["a.parquet:row 999", "a.parquet:row 1001"],
    }


@pytest.mark.parametrize("fmt", ["parquet", "jsonl", "csv"])
def test_an_id_repeated_in_another_file_names_both_files_from_the_input_root(tmp_path, fmt):
    root = tmp_path / "in"
    for folder, ids in (("2024", ["a", "b"]), ("2025", ["c", "a"])):
        (root / folder).mkdir(parents=True)
        write_rows(root / folder / f"part.{fmt}", [{"id": i, "prompt": "p"} for i in ids])
    cfg = _cfg(root)
    total, dups = scan_ids(cfg)
    first, again = {"parquet": ("row 0", "row 1"), "jsonl": ("line 1", "line 2")}.get(
        fmt,
        ("line 2", "line 3"),  # CSV: under its header
    )
    assert (total, dups) == (4, {"a": [f"2024/part.{fmt}:{first}", f"2025/part.{fmt}:{again}"]})
    assert describe_duplicates(cfg, dups) == (
        f"1 duplicate ids in the input at {root} (ids must be unique):\n"
        f"  id 'a' at 2024/part.{fmt}:{first}, 2025/part.{fmt}:{again}"
    )


def test_dictionary_encoded_ids_are_their_values(tmp_path):
    """pandas writes a Categorical column dictionary-encoded: its ids are checked (and
    committed rows found) as plain strings' are."""
    ids = pa.array(["x", "y", "x", None]).dictionary_encode()
    batch = pa.record_batch({"id": ids, "prompt": ["p"] * 4})
    assert batch_ids(batch, "f.parquet", 0, "id").to_pylist() == ["x", "y", "x", None]
    pq.write_table(pa.table({"id": ids, "prompt": ["p"] * 4}), tmp_path / "a.parquet")
    total, dups = scan_ids(_cfg(tmp_path / "a.parquet"))
    assert total == 4 and list(dups) == ["x"]


def test_scan_csv_and_jsonl_agree(tmp_path):
    (tmp_path / "a.csv").write_text("id,prompt\n1,x\n2,y\n1,z\n", encoding="utf-8")
    total, dups = scan_ids(_cfg(tmp_path / "a.csv"))
    assert total == 3 and list(dups) == ["1"]
    lines = [json.dumps({"id": i, "prompt": "p"}) for i in ("a", "b", "a", "c")]
    (tmp_path / "a.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    total, dups = scan_ids(_cfg(tmp_path / "a.jsonl"))
    assert total == 4 and list(dups) == ["a"]


def test_idset_equals_the_set_of_its_ids():
    assert IdSet() == set()
    assert IdSet.of(["a", "b"]) == {"b", "a"} and IdSet.of(["a"]) != {"a", "b"}


def test_fresh_rows_drop_committed_parquet_rows_by_id_column(tmp_path):
    from jobrunner.formats import read_rows
    from jobrunner.prep.fresh import FreshRows

    ids = [f"r{i}" for i in range(10)] + [None]
    pq.write_table(pa.table({"id": ids, "prompt": ["p"] * 11}), tmp_path / "a.parquet")
    cfg = _cfg(tmp_path / "a.parquet")
    cfg.input.batch_rows = 4
    fresh = FreshRows(cfg, IdSet.of(["r1", "r2", "r7"]))
    got = [(r.values["id"], r.source.row) for r in fresh]
    everything = [(r.values["id"], r.source.row) for r in read_rows(str(tmp_path / "a.parquet"))]
    assert got == [x for x in everything if x[0] not in ("r1", "r2", "r7")]
    assert fresh.skipped == 3


def _scan_like_the_preparer(cfg):
    """Every id the per-row rules give (Preparer.row_id over the reader's rows)."""
    from jobrunner.formats import make_preparer, read_rows

    prep = make_preparer(cfg, tokenizer=None)
    return {i for r in read_rows(cfg.input.path) if isinstance(i := prep.row_id(r), str)}


def test_the_vectorized_scan_gives_the_preparers_ids_in_nested_folders(tmp_path, monkeypatch):
    from jobrunner.input_scan import scan_input
    from jobrunner.prep.prepare import Preparer

    (tmp_path / "2024").mkdir()
    (tmp_path / "2025").mkdir()
    for d in ("2024", "2025"):  # no id column: ids derive from the file and row, by folder
        pq.write_table(pa.table({"prompt": ["p", "q", "r"]}), tmp_path / d / "part.parquet")
    pq.write_table(pa.table({"id": [3, 4], "prompt": ["s", "t"]}), tmp_path / "ints.parquet")
    cfg = _cfg(tmp_path)
    expected = _scan_like_the_preparer(cfg)
    assert "2024/part.parquet:2" in expected and "3" in expected
    # no Python object per row: the preparer's per-row rule is never called for Parquet
    monkeypatch.setattr(Preparer, "row_id", lambda self, raw: 1 / 0)
    scan = scan_input(cfg, set())
    assert (scan.total, scan.duplicates) == (8, {})
    assert scan.ids == expected


def test_a_changed_parquet_row_is_named_on_resume(tmp_path):
    import pytest

    from jobrunner.errors import ResumeMismatch
    from jobrunner.io.rundir import RunDir
    from jobrunner.lifecycle import RunOptions
    from jobrunner.resume import open_run

    prompts = [f"p{i}" for i in range(6)]
    data = tmp_path / "in" / "a.parquet"
    data.parent.mkdir()
    pq.write_table(pa.table({"id": [f"r{i}" for i in range(6)], "prompt": prompts}), data)
    cfg = JobConfig.model_validate(
        {"input": {"path": str(data)}, "output": {"path": str(tmp_path / "out")}}
    )
    rd = RunDir(cfg.output.path, "jsonl")
    rec = {"completion": "c", "finish_reason": "stop", "prompt_tokens": 1}
    with open_run(rd, cfg, RunOptions()) as (m, done, total):
        assert (len(done), total) == (0, 6)
        rd.commit(m, [{"id": "r0", **rec}], [])
    prompts[4] = "changed"
    pq.write_table(pa.table({"id": [f"r{i}" for i in range(6)], "prompt": prompts}), data)
    with (
        pytest.raises(ResumeMismatch, match=r"rows changed: 1 \('r4'\)"),
        open_run(RunDir(cfg.output.path, "jsonl"), cfg, RunOptions()),
    ):
        pass


def two_row_run(tmp_path):
    """A job over a two-row Parquet file (ids a and b), its run directory, a result record."""
    from jobrunner.io.rundir import RunDir

    data = tmp_path / "a.parquet"
    pq.write_table(pa.table({"id": ["a", "b"], "prompt": ["x", "y"]}), data)
    cfg = JobConfig.model_validate(
        {"input": {"path": str(data)}, "output": {"path": str(tmp_path / "out")}}
    )
    rec = {"completion": "c", "finish_reason": "stop", "prompt_tokens": 1}
    return cfg, RunDir(cfg.output.path, "jsonl"), rec


def test_strays_are_named_from_the_committed_shards(tmp_path):
    import pytest

    from jobrunner.errors import ResumeMismatch
    from jobrunner.io.rundir import RunDir
    from jobrunner.lifecycle import RunOptions
    from jobrunner.resume import open_run

    cfg, rd, rec = two_row_run(tmp_path)
    with open_run(rd, cfg, RunOptions()) as (m, done, total):
        rd.commit(m, [{"id": i, **rec} for i in ("a", "gone1", "gone2")], [])
    # the input holds a and b: gone1 and gone2 are named, read back from the shard's ids
    with (
        pytest.raises(ResumeMismatch, match=r"2 committed rows .* \('gone1', 'gone2'\)"),
        open_run(RunDir(cfg.output.path, "jsonl"), cfg, RunOptions()),
    ):
        pass


def test_resume_gets_the_committed_ids_as_an_idset(tmp_path):
    from jobrunner.io.rundir import RunDir
    from jobrunner.lifecycle import RunOptions
    from jobrunner.resume import open_run

    cfg, rd, rec = two_row_run(tmp_path)
    with open_run(rd, cfg, RunOptions()) as (m, done, total):
        rd.commit(m, [{"id": "a", **rec}], [])
    with open_run(RunDir(cfg.output.path, "jsonl"), cfg, RunOptions()) as (m, done, total):
        assert isinstance(done, IdSet) and done == {"a"} and total == 2


def test_uuid_ids_are_their_canonical_text_in_the_scan_and_the_preparer(tmp_path):
    """DuckDB and Iceberg write UUID ids as Parquet's UUID type (pyarrow: arrow.uuid): the
    vectorized scan, the committed-row skip and the preparer all give str(uuid)."""
    import uuid

    from jobrunner.input_scan import scan_input

    ids = [uuid.UUID(int=(7 << 120) + i) for i in range(3)] + [uuid.uuid4()]
    col = pa.array([u.bytes for u in ids], pa.uuid())
    table = pa.table({"id": col, "prompt": ["p"] * 4})
    want = [str(u) for u in ids]
    assert batch_ids(table.to_batches()[0], "f.parquet", 0, "id").to_pylist() == want
    assert batch_ids(table.slice(1, 2), "f.parquet", 1, "id").to_pylist() == want[1:3]
    with_null = pa.record_batch({"id": pa.array([ids[0].bytes, None], pa.uuid())})
    assert batch_ids(with_null, "f.parquet", 0, "id").to_pylist() == [want[0], None]
    pq.write_table(table, tmp_path / "a.parquet")
    cfg = _cfg(tmp_path / "a.parquet")
    assert _scan_like_the_preparer(cfg) == set(want)
    assert scan_input(cfg, set()).ids == set(want)


def test_binary_ids_are_their_utf8_text_in_the_scan_and_the_preparer(tmp_path):
    """Hive and Impala write string ids as Parquet BINARY: the scan and the preparer both read
    the text; a value that is not UTF-8 is an invalid id (the row's error: invalid_utf8)."""
    from jobrunner.input_scan import scan_input

    for kind in (pa.binary(), pa.large_binary(), pa.binary_view()):
        col = pa.array([b"a", "\u00e9".encode(), b"  ", None, b"\xff"], kind)
        batch = pa.record_batch({"id": col})
        assert batch_ids(batch, "f", 0, "id").to_pylist() == ["a", "\u00e9", None, None, None]
    col = pa.array([b"a", "\u00e9".encode(), b"\xff"], pa.binary())
    pq.write_table(pa.table({"id": col, "prompt": ["p"] * 3}), tmp_path / "a.parquet")
    cfg = _cfg(tmp_path / "a.parquet")
    assert _scan_like_the_preparer(cfg) == {"a", "\u00e9"}
    assert scan_input(cfg, set()).ids == {"a", "\u00e9"}
