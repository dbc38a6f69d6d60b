"""Whole jobs from s3:// to s3:// against a real S3 API server (moto), as subprocesses on the
real model: a full run equals the local one, kill -9 and a failed PUT mid-commit resume to
every row exactly once, and two runs on one prefix never both commit."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from crashkit import (
    CLI,
    COMPARED,
    env,
    kill9,
    reference,
    run,
    start,
    summary,
    write_input,
    write_job,
)
from s3kit import KEY_ID, SECRET

from jobrunner.io import fs as store

pytestmark = pytest.mark.slow


def s3_job(tmp_path: Path, bucket: str, out: str = "out", **extra) -> tuple[Path, str]:
    """The crash-kit job with its input uploaded to `bucket` and its run directory there."""
    local = write_input(tmp_path / "in.jsonl")
    f, root = store.filesystem(bucket)
    f.put_file(str(local), f"{root}/corpus/in.jsonl")
    job = write_job(tmp_path, "static", local, out=out, **extra)
    spec = json.loads(job.read_text())
    spec["input"]["path"] = f"{bucket}/corpus/*.jsonl"
    spec["output"]["path"] = url = f"{bucket}/{out}"
    job.write_text(json.dumps(spec))
    return job, url


def store_rows(url: str) -> tuple[list[tuple], list[tuple]]:
    """(result rows, error rows) the commit records list, sorted, as crashkit.comparable."""
    from jobrunner.io.store_rundir import StoreRunDir

    rd = StoreRunDir(url)
    rows = []
    for shard in rd.shard_files():
        with store.open_file(shard) as f:
            rows += [json.loads(line) for line in f if line.strip()]
    errors = [(e["id"], e["line"], e["code"]) for e in rd.iter_errors()]
    return sorted(tuple(r[k] for k in COMPARED) for r in rows), sorted(errors, key=repr)


def commits(url: str) -> int:
    """The commit records now (the client's cached listing dropped: another process adds them)."""
    f, root = store.filesystem(url)
    f.invalidate_cache(f"{root}/commits")
    return len(f.ls(f"{root}/commits")) if f.exists(f"{root}/commits") else 0


def assert_no_garbage(url: str) -> None:
    """A finished run's results/ holds exactly the shards its manifest lists."""
    f, root = store.filesystem(url)
    listed = {s["name"] for s in json.loads(f.cat_file(f"{root}/manifest.json"))["shards"]}
    assert {k.rsplit("/", 1)[-1] for k in f.ls(f"{root}/results")} == listed


def test_a_job_from_s3_to_s3_equals_the_local_run(tmp_path, s3_bucket):
    _, expected = reference("static")
    job, url = s3_job(tmp_path, s3_bucket)
    p = run(job)
    assert p.returncode == 0, p.stderr[-3000:]
    assert summary(p.stdout)["output"] == url
    assert store_rows(url) == expected
    f, root = store.filesystem(url)
    for name in ("_SUCCESS", "manifest.json", "report.json", "errors.jsonl"):
        assert f.exists(f"{root}/{name}"), name
    manifest = json.loads(f.cat_file(f"{root}/manifest.json"))
    assert manifest["counts"] == {"succeeded": 24, "failed": 2}
    p = run(job)  # a finished job answers from the store
    assert p.returncode == 0 and summary(p.stdout)["status"] == "nothing_to_do", p.stderr[-2000:]
    p = subprocess.run([*CLI, "validate", str(job)], capture_output=True, text=True, env=env())
    assert p.returncode == 0 and summary(p.stdout)["output_state"] == "finished", p.stderr
    # Credentials never land in what the run writes: not in the store, not in the staging dir.
    written = [f.cat_file(k) for k in f.find(root)]
    written += [p.read_bytes() for p in (tmp_path / "staging").rglob("*") if p.is_file()]
    assert written and not [b for b in written if KEY_ID.encode() in b or SECRET.encode() in b]


def test_kill9_and_a_failed_put_resume_to_each_row_once(tmp_path, s3_bucket):
    kill9_and_a_failed_put_resume_to_each_row_once(tmp_path, s3_bucket)


def kill9_and_a_failed_put_resume_to_each_row_once(tmp_path: Path, root: str) -> None:
    """A run killed after a shard, before its record; one whose record PUT fails (75); one
    killed at an arbitrary moment: the rerun ends with every row once, no garbage (each store)."""
    _, expected = reference("static")
    job, url = s3_job(tmp_path, root)
    p = run(job, JOBRUNNER_FAULT_KILL="after_shard:2")  # shard 2 written, its record not
    assert p.returncode == -9, p.stderr[-2000:]
    p = run(job, JOBRUNNER_FAULT_PUT="record:2")  # commit 2: shard written, its record PUT fails
    assert p.returncode == 75, p.stderr[-2000:]
    assert "injected failure of the record PUT" in p.stderr
    proc = start(job)  # killed at an arbitrary moment while rows are generated
    before = commits(url)
    deadline = time.monotonic() + 300
    while commits(url) < before + 2 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    kill9(proc)
    rows, _ = store_rows(url)
    assert len({r[0] for r in rows}) == len(rows)  # each committed row once
    p = run(job)
    assert p.returncode == 0, p.stderr[-3000:]
    assert store_rows(url) == expected
    assert_no_garbage(url)


def test_two_runs_on_one_prefix_commit_each_row_once(tmp_path, s3_bucket):
    _, expected = reference("static")
    job, url = s3_job(tmp_path, s3_bucket)
    # two machines: separate staging dirs (and locks), so only the store's conditional writes
    # keep them apart
    procs = [start(job, JOBRUNNER_STAGING_DIR=str(tmp_path / f"m{k}")) for k in range(2)]
    outs = [p.communicate(timeout=900) for p in procs]
    codes = sorted(p.returncode for p in procs)
    assert codes[0] == 0, outs
    assert codes[1] in (0, 78), outs  # the loser stops with RunLocked, or found nothing to do
    if codes[1] == 78:
        assert "is being run by another jobrunner" in "".join(o[1] for o in outs)
    assert store_rows(url) == expected
    assert_no_garbage(url)


def test_a_run_over_its_error_budget_leaves_the_errors_jsonl_it_names(tmp_path, s3_bucket):
    """Exit 65 says 'see <run>/errors.jsonl': a store run assembled that object only when it
    succeeded, so the file the message named did not exist."""
    job, url = s3_job(tmp_path, s3_bucket, engine__kind="paged")
    p = run(job, JOBRUNNER_FAULT_OOM_STEPS="1,2,3,4,5,6")  # rows fail in the engine
    assert p.returncode == 65, p.stderr[-3000:]
    assert f"see {url}/errors.jsonl" in summary(p.stdout)["error"]
    f, root = store.filesystem(url)
    first = f.cat_file(f"{root}/errors.jsonl")
    lines = [json.loads(x) for x in first.decode().splitlines()]
    _, errors = store_rows(url)
    got = sorted(((e["id"], e["line"], e["code"]) for e in lines), key=repr)
    assert got == errors != []
    assert not f.exists(f"{root}/_SUCCESS")
    # a --retry-errors killed before its record leaves the run as it was: 65, errors.jsonl there
    p = run(job, "--retry-errors", JOBRUNNER_FAULT_KILL="retry_unmarked:1")
    assert p.returncode == -9, p.stderr[-3000:]
    p = run(job)
    assert p.returncode == 65, p.stderr[-3000:]
    assert f.cat_file(f"{root}/errors.jsonl") == first
