"""--retry-errors on a run directory in an object store, against a real S3 API server (moto).

The store's retry is one commit record that supersedes the failed rows (io/store_rundir.py,
module doc). Checked here: a crash before any write or delete of the retry leaves a directory
that a plain rerun and then a --retry-errors complete with every row exactly once and the failed
attempts' cost kept; and whole jobs on the real model (the slow tests below) equal a local run
with --retry-errors, kill -9 and a failed PUT mid-retry included.
"""

from __future__ import annotations

import itertools
import json

import pytest
from crashkit import comparable, run, summary, write_input, write_job
from test_objstore_jobs import assert_no_garbage, s3_job, store_rows

from jobrunner.io import fs as store
from jobrunner.io.rundir import read_column
from jobrunner.io.store_rundir import StoreRunDir
from jobrunner.types import RowError, RowRef

IDS = {f"r{i}" for i in range(5)}
FAILED = {"r1", "r2", "r3"}  # r1 beside a row that succeeded, r2 alone in a shard, r3 at input


def _rec(i: int, cost: float, reason: str = "stop") -> dict:
    tokens = {"prompt_tokens": 1, "cached_tokens": 0, "completion_tokens": 1}
    return {"id": f"r{i}", "completion": "c", "finish_reason": reason, "cost_usd": cost, **tokens}


def _err(i: int) -> RowError:
    return RowError("nan_logits", "the logits were NaN", RowRef("in.jsonl", i), f"r{i}")


def _finished_with_errors(url: str, fmt: str) -> None:
    """A finished run (_SUCCESS, errors.jsonl) of rows r0-r4 whose r1-r3 failed; 8.0 USD."""
    rd = StoreRunDir(url, fmt)
    m = rd.prepare()
    rd.save_manifest(m)
    rd.commit(m, [_rec(0, 1.0), _rec(1, 2.0, "error")], [_err(1)])
    rd.commit(m, [_rec(2, 4.0, "error")], [_err(2)])
    rd.commit(m, [_rec(4, 1.0)], [_err(3)])
    rd.mark_success(m)


class Crashed(Exception):
    """The process died here: nothing after it runs (no handler in the retry cleans up)."""


class CrashingStore:
    """A store client that dies before its `n`-th write or delete (PUT, DELETE)."""

    WRITES = ("pipe_file", "rm_file", "rm", "open")

    def __init__(self, fs, n: int) -> None:
        self._fs, self.left = fs, n

    def __getattr__(self, name: str):
        real = getattr(self._fs, name)
        if name not in self.WRITES:
            return real

        def write(*args, **kwargs):
            if name == "open" and "w" not in (args[1] if len(args) > 1 else kwargs.get("mode", "")):
                return real(*args, **kwargs)
            self.left -= 1
            if self.left == 0:
                raise Crashed(name)
            return real(*args, **kwargs)

        return write


def _state(url: str, fmt: str) -> tuple[list[str], set[str], set[str]]:
    """(ids in the listed shards, with repeats; those that succeeded; ids in listed errors)."""
    rd = StoreRunDir(url, fmt)
    ids, ok = [], set()
    for shard in rd.shard_files():
        got, reasons = read_column(shard, "id"), read_column(shard, "finish_reason")
        ids += got
        ok |= {i for i, r in zip(got, reasons, strict=True) if r != "error"}
    return ids, ok, {e["id"] for e in rd.iter_errors()}


def _errors_file_ids(url: str) -> set[str]:
    f, root = store.filesystem(url)
    if not f.exists(f"{root}/errors.jsonl"):
        return set()
    return {json.loads(x)["id"] for x in f.cat_file(f"{root}/errors.jsonl").splitlines() if x}


def _rerun(url: str, fmt: str, retry_errors: bool) -> None:
    """What `jobrunner run` does to the run directory: the rows not committed run (and now
    succeed, at 0.5 USD each), then the run finishes."""
    rd = StoreRunDir(url, fmt)
    m = rd.prepare()
    if retry_errors:
        rd.forget_failed(m)
    rd.save_manifest(m)
    pending = sorted(IDS - rd.committed_ids())
    if pending:
        rd.commit(m, [_rec(int(i[1:]), 0.5) for i in pending], [])
    rd.mark_success(m)


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_a_crash_at_any_write_of_a_retry_loses_and_duplicates_no_row(s3_bucket, fmt):
    from jobrunner.telemetry.report import build_report

    for n in itertools.count(1):
        url = f"{s3_bucket}/run-{fmt}-{n}"
        _finished_with_errors(url, fmt)
        rd = StoreRunDir(url, fmt)
        m = rd.prepare()
        rd.fs = CrashingStore(rd.fs, n)
        try:
            assert rd.forget_failed(m) == 3
            crashed = False
        except Crashed:
            crashed = True
        ids, ok, errors = _state(url, fmt)
        assert len(ids) == len(set(ids)) and not ok & errors, n  # never two states of a row
        # the records as they were, or the failed rows pending: nothing in between
        assert (ok, errors) in (({"r0", "r4"}, FAILED), ({"r0", "r4"}, set())), (n, ok, errors)
        _rerun(url, fmt, retry_errors=False)  # a plain rerun completes what was left
        ids, ok, errors = _state(url, fmt)
        assert len(ids) == len(set(ids)) and ok | errors == IDS and not ok & errors, n
        assert _errors_file_ids(url) == errors, n  # errors.jsonl says what the records say
        _rerun(url, fmt, retry_errors=True)
        ids, ok, errors = _state(url, fmt)
        assert sorted(ids) == sorted(IDS) and ok == IDS and errors == set(), n
        done = StoreRunDir(url, fmt)
        assert done.finished and not done.has_errors
        # the failed attempts (2.0 + 4.0) stay paid, once, beside the rows committed
        assert done.load_manifest().retired_cost_usd == pytest.approx(6.0), n
        assert build_report(done).cost.cost_usd == pytest.approx(3.5 + 6.0), n
        assert_no_garbage(url)
        f, root = store.filesystem(url)
        assert not f.exists(f"{root}/errors.jsonl") and f.find(f"{root}/errors") == [], n
        if not crashed:
            break
    assert n > 8  # every write and delete of the retry was a crash point


def test_a_retry_beside_another_run_stops_and_leaves_that_runs_state(s3_bucket):
    """A --retry-errors whose record number another run took first stops (RunLocked) and
    deletes the objects it wrote; one that finds its shards replaced by another run's retry
    stops too, before writing any."""
    from jobrunner.errors import RunLocked

    url = f"{s3_bucket}/run"
    _finished_with_errors(url, "parquet")
    a, b, c = StoreRunDir(url), StoreRunDir(url), StoreRunDir(url)
    ma, mb, mc = a.prepare(), b.prepare(), c.prepare()
    a.save_manifest(ma)  # a claims the next record; b read the prefix before that
    with pytest.raises(RunLocked, match="another jobrunner"):
        b.forget_failed(mb)
    assert _state(url, "parquet") == (["r0", "r1", "r2", "r4"], {"r0", "r4"}, FAILED)
    f, root = store.filesystem(url)
    listed = {s["name"] for s in StoreRunDir(url).load_manifest().shards}
    assert {k.rsplit("/", 1)[-1] for k in f.ls(f"{root}/results")} == listed
    a = StoreRunDir(url)
    assert a.forget_failed(a.prepare()) == 3
    with pytest.raises(RunLocked, match="another jobrunner"):  # c's shards are replaced
        c.forget_failed(mc)
    assert _state(url, "parquet") == (["r0", "r4"], {"r0", "r4"}, set())


# ------------------------------------------------------------- with the real model

OOM = {"JOBRUNNER_FAULT_OOM_STEPS": "1,2,3,4,5,6"}  # rows fail in the engine, in a shard
LOOSE = ("--set", "input.max_error_rate=0.9")


def _failed_rows_cost(rows: list[dict]) -> float:
    return sum(r["cost_usd"] or 0.0 for r in rows if r["finish_reason"] == "error")


def _store_records(url: str) -> list[dict]:
    rows = []
    for shard in StoreRunDir(url).shard_files():
        with store.open_file(shard) as f:
            rows += [json.loads(line) for line in f if line.strip()]
    return rows


def _report(url: str) -> dict:
    f, root = store.filesystem(url)
    return json.loads(f.cat_file(f"{root}/report.json"))


@pytest.mark.slow
def test_retry_errors_on_a_store_equals_the_local_retry_through_a_crash(tmp_path, s3_bucket):
    """Rows failed in the engine (out of memory) and at input: --retry-errors on the store,
    through a failed PUT and a kill -9 mid-retry, ends as the same retry of a local run."""
    local = tmp_path / "local"
    local.mkdir()
    job = write_job(local, "paged", write_input(local / "in.jsonl"))
    assert run(job, *LOOSE, **OOM).returncode == 0
    assert run(job, "--retry-errors").returncode == 0
    expected = comparable(local / "out")

    job, url = s3_job(tmp_path, s3_bucket, engine__kind="paged")
    p = run(job, *LOOSE, **OOM)
    assert p.returncode == 0, p.stderr[-3000:]
    first = _store_records(url)
    failed = {r["id"] for r in first if r["finish_reason"] == "error"}
    assert failed, "rows must fail as oom in the engine, in a shard"
    paid = _report(url)["cost"]["cost_usd"]
    p = run(job, "--retry-errors", JOBRUNNER_FAULT_KILL="retry_shards:1")
    assert p.returncode == -9, p.stderr[-2000:]
    p = run(job, "--retry-errors", JOBRUNNER_FAULT_PUT="record:1")  # the retry's record
    assert p.returncode == 75 and "injected failure of the record PUT" in p.stderr
    assert {r["id"] for r in _store_records(url) if r["finish_reason"] == "error"} == failed
    p = run(job, "--retry-errors", JOBRUNNER_FAULT_KILL="retry_record:1")
    assert p.returncode == -9, p.stderr[-2000:]
    rows, errors = store_rows(url)
    assert errors == [] and not failed & {r[0] for r in rows}  # pending now, not failed
    assert len({r[0] for r in rows}) == len(rows)
    p = run(job)  # a plain rerun completes the retry
    assert p.returncode == 0, p.stderr[-3000:]
    assert store_rows(url) == expected
    assert_no_garbage(url)
    report = _report(url)
    assert report["cost"]["retried_attempts_usd"] == pytest.approx(_failed_rows_cost(first))
    assert report["cost"]["cost_usd"] > paid  # the failed attempts stay paid
    f, root = store.filesystem(url)
    assert f.exists(f"{root}/_SUCCESS")
    errors_file = [json.loads(x) for x in f.cat_file(f"{root}/errors.jsonl").splitlines()]
    assert sorted(((e["id"], e["line"], e["code"]) for e in errors_file), key=repr) == expected[1]


@pytest.mark.slow
def test_fixed_failed_rows_are_retried_on_a_store_then_nothing_is_left(tmp_path, s3_bucket):
    """The input's bad rows fixed: a plain run refuses the changed input offering --retry-errors,
    which takes it (only failed rows changed) and ends clean; again, nothing_to_do."""
    job, url = s3_job(tmp_path, s3_bucket)
    p = run(job)
    assert p.returncode == 0 and summary(p.stdout)["rows"]["failed"] == 2, p.stderr[-3000:]
    f, root = store.filesystem(f"{s3_bucket}/corpus/in.jsonl")
    fixed = f.cat_file(root).replace(b'"prompt": "   "', b'"prompt": "Say hi."')
    fixed = fixed.replace(b'"prompt": \n', b'"prompt": "Say one."}\n')
    f.pipe_file(root, fixed)
    p = run(job)
    assert p.returncode == 78, p.stderr[-2000:]
    assert "--retry-errors if only failed rows changed" in summary(p.stdout)["error"]
    p = run(job, "--retry-errors")
    assert p.returncode == 0, p.stderr[-3000:]
    assert summary(p.stdout)["rows"] == {"succeeded": 26, "failed": 0, "skipped": 24}
    rows, errors = store_rows(url)
    assert errors == [] and sorted(r[0] for r in rows) == sorted(
        ["bad-empty", "bad-json", *(f"r{i:02d}" for i in range(24))]
    )
    p = run(job, "--retry-errors")
    assert p.returncode == 0 and summary(p.stdout)["status"] == "nothing_to_do", p.stderr
