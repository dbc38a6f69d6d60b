"""A resume skips the Parquet row groups its committed shards hold whole without reading their
ids (io/row_ranges.py, prep/fresh.py), and still gives every row exactly once after kill -9."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from crashkit import assert_complete_files, assert_each_row_once, read_results, run, write_job

from jobrunner.config import JobConfig
from jobrunner.io.ids import IdSet
from jobrunner.io.row_ranges import CommittedRows, forget, merged, record, runs
from jobrunner.prep.fresh import FreshRows
from jobrunner.types import RowRef


def test_rows_become_runs_and_runs_merge():
    start, stop = runs(np.array([0, 1, 2, 5, 7, 8]))
    assert start.tolist() == [0, 5, 7] and stop.tolist() == [3, 6, 9]
    start, stop = merged(np.array([7, 0, 3, 20]), np.array([9, 3, 5, 21]))
    assert start.tolist() == [0, 7, 20] and stop.tolist() == [5, 9, 21]
    rows = CommittedRows({"a": (start, stop)})
    assert rows.covers("a", 0, 5) and rows.covers("a", 1, 4) and rows.covers("a", 20, 21)
    assert not rows.covers("a", 4, 8) and not rows.covers("a", 5, 6) and not rows.covers("b", 0, 1)


def test_only_the_ranges_of_shards_present_count(tmp_path):
    record(tmp_path, "part-00000.jsonl", [RowRef("in.parquet", r) for r in (3, 0, 1, 2)])
    record(tmp_path, "part-00001.jsonl", [RowRef("in.parquet", 4), RowRef("other.parquet", 0)])
    both = CommittedRows.read(tmp_path, ["part-00000.jsonl", "part-00001.jsonl"])
    assert both.covers("in.parquet", 0, 5) and both.covers("other.parquet", 0, 1)
    first = CommittedRows.read(tmp_path, ["part-00000.jsonl", "part-00009.jsonl"])
    assert first.covers("in.parquet", 0, 4) and not first.covers("in.parquet", 0, 5)
    forget(tmp_path, "part-00000.jsonl")  # a shard of this name is about to be published
    assert not CommittedRows.read(tmp_path, ["part-00000.jsonl"])
    record(tmp_path, "part-00002.jsonl", [RowRef("in.parquet", 0), None])  # a row with no place
    assert not CommittedRows.read(tmp_path, ["part-00002.jsonl"])


def test_a_covered_row_group_is_not_read(tmp_path, monkeypatch):
    ids = [f"r{i}" for i in range(12)]
    path = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": ids, "prompt": ["p"] * 12}), path, row_group_size=4)
    cfg = JobConfig.model_validate({"input": {"path": str(path), "batch_rows": 2}})
    done = IdSet.of(ids[:4] + ids[5:7])  # group 0 whole, group 1 in part
    covered = CommittedRows({str(path): (np.array([0, 5]), np.array([4, 7]))})
    read_groups = []
    real = pq.ParquetFile.read_row_group

    def spy(self, i, *args, **kwargs):
        read_groups.append(i)
        return real(self, i, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "read_row_group", spy)
    fresh = FreshRows(cfg, done, covered)
    got = [r.values["id"] for r in fresh]
    assert got == ["r4", "r7", *ids[8:]]
    assert fresh.skipped == 6
    assert 0 not in read_groups and 1 in read_groups


@pytest.mark.slow
def test_kill9_after_commits_then_resume_skips_and_gives_every_row_once(tmp_path):
    rows = 16
    data = tmp_path / "in.parquet"
    prompts = [f"Write one word that rhymes with word{i}." for i in range(rows)]
    table = pa.table({"id": [f"r{i:02d}" for i in range(rows)], "prompt": prompts})
    pq.write_table(table, data, row_group_size=4)
    job = write_job(tmp_path, "paged", data, generation__max_new_tokens=2)
    out = tmp_path / "out"
    p = run(job, JOBRUNNER_FAULT_KILL="after_manifest:2")
    assert p.returncode == -9, p.stderr[-2000:]
    assert_complete_files(out)
    shards = sorted(f.name for f in (out / "results").glob("part-*"))
    assert len(shards) == 2
    assert sorted(f.name for f in (out / "rows").iterdir()) == shards
    committed = CommittedRows.read(out, shards)
    start, stop = committed.ranges[str(data)]
    held = int((stop - start).sum())
    assert held == 8  # the two shards' rows, by place in the input

    p = run(job)
    assert p.returncode == 0, p.stderr[-2000:]
    assert_each_row_once(out)
    assert sorted(r["id"] for r in read_results(out)) == [f"r{i:02d}" for i in range(rows)]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["counts"]["succeeded"] == rows

    p = run(job, "--restart")
    assert p.returncode == 0, p.stderr[-2000:]
    assert_each_row_once(out)
    names = {f.name for f in (out / "results").glob("part-*")}
    assert {f.name for f in (out / "rows").iterdir()} == names  # the old ranges went too


def test_a_commit_records_its_rows_and_retry_errors_forgets_them(tmp_path):
    from jobrunner.io.rundir import RunDir

    rd = RunDir(tmp_path / "run", "jsonl")
    rd.path.mkdir()
    m = rd.prepare()
    record_of = {"finish_reason": "stop", "completion": "x", "prompt_tokens": 1}
    records = [{"id": f"r{i}", **record_of} for i in range(3)]
    rd.commit(m, records, [], [RowRef("in.parquet", i) for i in (2, 0, 1)])
    shard = rd.shard_files()[0].name
    assert rd.committed_rows().covers("in.parquet", 0, 3)
    assert (rd.path / "rows" / shard).is_file()
    rd.forget_failed(m)  # --retry-errors rewrites shards: every range goes first
    assert not (rd.path / "rows").exists() and not rd.committed_rows()
