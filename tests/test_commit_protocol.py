"""The commit protocol of io/rundir.py under crashes at random points (promises 1, 2, 4).

A simulated job commits rows of four kinds (succeeded, failed in the engine, rejected at input
with an id, rejected without one) through RunDir exactly as the pipeline does. A crash is an
exception at the n-th fsync or rename; after it the test leaves the debris a kill -9 can leave
(a torn errors.jsonl line, half-written temporary files), checks that every visible file is
complete, and runs the job again, as many times as it takes. The finished run directory must hold
every row exactly once, in the right state, with manifest counts that match the files.
"""

from __future__ import annotations

import fcntl
import json
import os

import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from jobrunner.io.rundir import RunDir, read_column, read_shard
from jobrunner.types import RowError, RowRef

KINDS = ["ok", "engine_error", "input_error", "no_id_error"]


class Crash(Exception):
    pass


class CrashAt:
    """Raise Crash at the n-th os.fsync / os.replace of an attempt (None: never)."""

    def __init__(self, monkeypatch, torn: bool) -> None:
        self.n: int | None = None
        self.calls = 0
        self.torn = torn
        real_fsync, real_replace = os.fsync, os.replace

        def fsync(fd):
            self._tick(fd)
            return real_fsync(fd)

        def replace(src, dst):
            self._tick(None)
            return real_replace(src, dst)

        monkeypatch.setattr(os, "fsync", fsync)
        monkeypatch.setattr(os, "replace", replace)

    def arm(self, n: int | None) -> None:
        self.n, self.calls = n, 0

    def _tick(self, fd) -> None:
        self.calls += 1
        if self.n is not None and self.calls == self.n:
            if self.torn and fd is not None and _is_errors_append(fd):
                os.ftruncate(fd, max(0, os.fstat(fd).st_size - 3))  # a torn last line
            raise Crash


def _is_errors_append(fd: int) -> bool:
    """Only an append can be torn by a crash; a truncate that crashes before its fsync leaves
    the old or the new length, never a shorter file."""
    return _fd_path(fd).endswith("errors.jsonl") and bool(
        fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_APPEND
    )


def _fd_path(fd: int) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return ""


def _ref(i: int) -> RowRef:
    return RowRef("in.jsonl", i, line=i + 1)


def _record(i: int, reason: str) -> dict:
    return {
        "id": f"r{i}",
        "completion": f"text {i}",
        "finish_reason": reason,
        "prompt_tokens": i,
        "cached_tokens": 0,
        "completion_tokens": 1,
        "cost_usd": 0.0,
        "model": "m",
    }


def run_once(path, kinds: list[str], shard_rows: int, fmt: str) -> None:
    """One invocation of the job, as pipeline + committer do it: skip committed ids, commit
    every `shard_rows` finished rows with the errors gathered meanwhile, then mark success."""
    rd = RunDir(path, fmt)
    m = rd.prepare()
    done = rd.committed_ids()
    records: list[dict] = []
    errors: list[RowError] = []
    for i, kind in enumerate(kinds):
        if f"r{i}" in done:
            continue
        if kind == "ok":
            records.append(_record(i, "stop"))
        elif kind == "engine_error":
            records.append(_record(i, "error"))
            errors.append(RowError("nan_logits", "the logits were NaN", _ref(i), f"r{i}"))
        elif kind == "input_error":
            errors.append(RowError("empty_prompt", "the prompt is empty", _ref(i), f"r{i}"))
        else:
            errors.append(RowError("malformed_json", "malformed JSON", _ref(i)))
        if len(records) >= shard_rows:
            rd.commit(m, records, errors)
            records, errors = [], []
    rd.commit(m, records, errors)
    rd.mark_success(m)


def leave_debris(path) -> None:
    """What a kill -9 can leave besides the torn line: half-written temporary files."""
    (path / "results").mkdir(parents=True, exist_ok=True)
    (path / "results" / ".part-00077.parquet.tmp999").write_bytes(b"PAR1\x00half")
    (path / ".manifest.json.tmp999").write_text('{"shards": [')


def assert_visible_files_complete(path) -> None:
    for f in sorted((path / "results").glob("part-*")):
        if f.suffix == ".parquet":
            pq.read_table(f)
        else:
            for line in f.read_text(encoding="utf-8").splitlines():
                json.loads(line)
    if (path / "manifest.json").exists():
        json.loads((path / "manifest.json").read_text())


def assert_exactly_once(path, kinds: list[str]) -> None:
    rd = RunDir(path)
    ids = [i for f in rd.shard_files() for i in read_column(f, "id")]
    assert sorted(ids) == sorted(
        f"r{i}" for i, k in enumerate(kinds) if k in ("ok", "engine_error")
    )
    for f in rd.shard_files():
        for rec in read_shard(f):
            i = int(rec["id"][1:])
            assert rec == _record(i, "stop" if kinds[i] == "ok" else "error")
    places = [(e["line"], e["code"], e["id"]) for e in rd.iter_errors()]
    assert sorted(places) == sorted(
        (
            i + 1,
            {
                "engine_error": "nan_logits",
                "input_error": "empty_prompt",
                "no_id_error": "malformed_json",
            }[k],
            None if k == "no_id_error" else f"r{i}",
        )
        for i, k in enumerate(kinds)
        if k != "ok"
    )
    m = rd.load_manifest()
    assert m.counts["succeeded"] == kinds.count("ok")
    assert m.counts["failed"] == len(kinds) - kinds.count("ok")
    assert sorted(s["name"] for s in m.shards) == [f.name for f in rd.shard_files()]
    assert sum(s["rows"] for s in m.shards) == len(ids)
    assert m.errors_bytes == rd.errors_path.stat().st_size if rd.errors_path.exists() else True
    assert rd.finished


def run_with_crashes(tmp_path, monkeypatch, kinds, shard_rows, fmt, crashes, torn) -> None:
    crash = CrashAt(monkeypatch, torn)
    for n in [*crashes, None]:
        crash.arm(n)
        try:
            run_once(tmp_path, kinds, shard_rows, fmt)
        except Crash:
            leave_debris(tmp_path)
            assert_visible_files_complete(tmp_path)
            continue
        break
    crash.arm(None)
    assert_exactly_once(tmp_path, kinds)


jobs = st.lists(st.sampled_from(KINDS), min_size=1, max_size=24)


@settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@example(
    kinds=["ok"] * 6 + ["engine_error"] * 2, shard_rows=1, fmt="jsonl", crashes=[44, 1], torn=True
)  # a crash while recovery truncates errors.jsonl must not tear a committed line
# a crash before the manifest lists a shard, then one right after the next commit's error lines:
# recovery must cut those lines, not keep them along with the adopted shard
@example(kinds=["ok", "engine_error"], shard_rows=1, fmt="jsonl", crashes=[3, 1], torn=False)
@given(
    kinds=jobs,
    shard_rows=st.integers(1, 5),
    fmt=st.sampled_from(["jsonl", "parquet"]),
    crashes=st.lists(st.integers(1, 120), max_size=4),
    torn=st.booleans(),
)
def test_random_crash_points_lose_and_duplicate_nothing(
    tmp_path_factory, monkeypatch, kinds, shard_rows, fmt, crashes, torn
):
    run_with_crashes(
        tmp_path_factory.mktemp("run"), monkeypatch, kinds, shard_rows, fmt, crashes, torn
    )


@pytest.mark.parametrize("n", range(1, 12))
def test_every_step_of_one_commit(tmp_path, monkeypatch, n):
    """A crash at each fsync/rename of a commit holding every kind of row, then a rerun."""
    kinds = ["ok", "engine_error", "input_error", "no_id_error", "ok"]
    run_with_crashes(tmp_path, monkeypatch, kinds, 5, "jsonl", [n], torn=True)


def test_shard_renamed_but_manifest_not_written_is_adopted(tmp_path, monkeypatch):
    """The crash between rename and manifest: the shard and its errors are kept, not redone."""
    kinds = ["ok", "engine_error", "ok", "input_error"]
    crash = CrashAt(monkeypatch, torn=False)
    real_save = RunDir.save_manifest
    state = {"saves": 0}

    def save(self, m):
        state["saves"] += 1
        if state["saves"] == 1:  # the commit's manifest write, right after the shard rename
            raise Crash
        real_save(self, m)

    monkeypatch.setattr(RunDir, "save_manifest", save)
    with pytest.raises(Crash):
        run_once(tmp_path, kinds, 4, "jsonl")
    monkeypatch.setattr(RunDir, "save_manifest", real_save)
    rd = RunDir(tmp_path, "jsonl")
    assert [f.name for f in rd.shard_files()] == ["part-00000.jsonl"]
    m = rd.prepare()
    size = (rd.results / "part-00000.jsonl").stat().st_size
    assert m.shards == [{"name": "part-00000.jsonl", "rows": 3, "bytes": size}]
    assert m.counts == {"succeeded": 2, "failed": 2}
    assert rd.committed_ids() == {"r0", "r1", "r2", "r3"}
    crash.arm(None)
    run_once(tmp_path, kinds, 4, "jsonl")
    assert_exactly_once(tmp_path, kinds)


def test_errors_without_shard_are_cut_back(tmp_path, monkeypatch):
    """Errors appended, then the crash before the shard: the batch's errors are redone once."""
    kinds = ["ok", "engine_error", "input_error"]
    crash = CrashAt(monkeypatch, torn=False)
    crash.arm(2)  # 1: errors.jsonl fsync, 2: the shard's temporary file fsync
    with pytest.raises(Crash):
        run_once(tmp_path, kinds, 3, "parquet")
    assert len((tmp_path / "errors.jsonl").read_text().splitlines()) == 2
    m = RunDir(tmp_path, "parquet").prepare()
    assert not (tmp_path / "errors.jsonl").read_text()
    assert m.counts == {"succeeded": 0, "failed": 0}
    crash.arm(None)
    run_once(tmp_path, kinds, 3, "parquet")
    assert_exactly_once(tmp_path, kinds)


def retry_once(path, kinds, shard_rows, fmt, fixed: set[int]) -> None:
    rd = RunDir(path, fmt)
    m = rd.prepare()
    rd.forget_failed(m)
    run_once(path, ["ok" if i in fixed else k for i, k in enumerate(kinds)], shard_rows, fmt)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(kinds=jobs, fmt=st.sampled_from(["jsonl", "parquet"]), crash=st.integers(1, 60))
def test_retry_errors_reruns_failed_rows_once(tmp_path_factory, monkeypatch, kinds, fmt, crash):
    """--retry-errors: rows that failed in the engine (in a shard and errors.jsonl) or at input
    run again; with the cause gone they succeed, exactly once, even after a crash mid-retry."""
    path = tmp_path_factory.mktemp("run")
    run_once(path, kinds, 3, fmt)
    fixed = {i for i, k in enumerate(kinds) if k in ("engine_error", "input_error")}
    crasher = CrashAt(monkeypatch, torn=False)
    crasher.arm(crash)
    try:
        retry_once(path, kinds, 3, fmt, fixed)
    except Crash:
        assert_visible_files_complete(path)
        crasher.arm(None)
        retry_once(path, kinds, 3, fmt, fixed)
    crasher.arm(None)
    assert_exactly_once(path, ["ok" if i in fixed else k for i, k in enumerate(kinds)])
