"""Resume after kill -9, idempotent reruns, changed jobs and the run lock (promises 2, 3, 8).

Real `jobrunner run` subprocesses on the real model (greedy, float32). kill -9 lands at exact
points of the commit protocol (JOBRUNNER_FAULT_KILL makes the process SIGKILL itself there) and
at an arbitrary moment while rows are being generated; after each kill the same command runs
again, and the finished run must equal an uninterrupted one.
"""

from __future__ import annotations

import fcntl
import gzip
import hashlib
import json
import subprocess
import sys

import pytest
from crashkit import (
    assert_complete_files,
    assert_each_row_once,
    comparable,
    kill9,
    read_results,
    reference,
    run,
    start,
    summary,
    wait_for_shards,
    write_input,
    write_job,
)
from typer.testing import CliRunner

from jobrunner.cli import app
from jobrunner.config import load_job
from jobrunner.io.rundir import RunDir
from jobrunner.pipeline import RunOptions
from jobrunner.resume import open_run

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("engine", ["static", "paged"])
def test_kill9_at_any_moment_then_rerun_equals_uninterrupted_run(tmp_path, engine):
    _, expected = reference(engine)
    job = write_job(tmp_path, engine, write_input(tmp_path / "in.jsonl"))
    out = tmp_path / "out"

    # 1. killed right after the first commit appended its errors, before its shard
    p = run(job, JOBRUNNER_FAULT_KILL="after_errors:1")
    assert p.returncode == -9, p.stderr[-2000:]
    assert_complete_files(out)
    assert not list((out / "results").glob("part-*"))

    # 2. killed between the first shard's rename and the manifest write (errors committed too)
    p = run(job, JOBRUNNER_FAULT_KILL="after_shard:1")
    assert p.returncode == -9, p.stderr[-2000:]
    assert_complete_files(out)
    listed = {s["name"] for s in json.loads((out / "manifest.json").read_text())["shards"]}
    unlisted = {f.name for f in (out / "results").glob("part-*")} - listed
    assert len(unlisted) == 1  # visible and complete, not yet in the manifest

    # 3. killed at an arbitrary moment while generating (the lock dies with the process)
    proc = start(job)
    wait_for_shards(proc, out / "results", more_than=len(listed) + 1)
    kill9(proc)
    assert_complete_files(out)
    assert_each_row_once(out)

    # 4. the same command again finishes the job
    p = run(job)
    assert p.returncode == 0, p.stderr[-2000:]
    assert summary(p.stdout)["status"] == "done"
    assert_each_row_once(out)
    assert comparable(out) == expected
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["counts"]["succeeded"] == 24 and manifest["counts"]["failed"] == 2
    assert sum(s["rows"] for s in manifest["shards"]) == 24
    assert (out / "_SUCCESS").exists()


def test_a_gzipped_input_killed_after_a_commit_resumes_to_the_plain_inputs_results(tmp_path):
    """A `.jsonl.gz` of the standard input gives its rows the plain file's ids, row and line
    numbers (errors.jsonl), and resumes after kill -9: committed rows are skipped, not rerun,
    and the finished run equals the uninterrupted run over the plain file."""
    _, expected = reference("static")
    packed = tmp_path / "in.jsonl.gz"
    packed.write_bytes(gzip.compress(write_input(tmp_path / "plain.jsonl").read_bytes()))
    job = write_job(tmp_path, "static", packed)
    out = tmp_path / "out"
    p = run(job, JOBRUNNER_FAULT_KILL="after_shard:2")
    assert p.returncode == -9, p.stderr[-2000:]
    done = {r["id"] for r in read_results(out)}
    assert len(done) == 8  # two shards of 4, and the errors of lines 4 and 10
    p = run(job)
    assert p.returncode == 0, p.stderr[-2000:]
    assert summary(p.stdout)["rows"]["skipped"] == len(done) + 1  # + the empty prompt, by id
    assert_each_row_once(out)
    assert comparable(out) == expected


def _digest(out) -> dict[str, str]:
    return {
        str(f.relative_to(out)): hashlib.sha256(f.read_bytes()).hexdigest()
        for f in sorted(out.rglob("*"))
        if f.is_file() and f.name != ".lock"
    }


def test_finished_job_rerun_loads_no_model_and_changes_no_byte(tmp_path):
    ref_out, _ = reference("static")
    before = _digest(ref_out)
    # Model code cannot even be imported in the rerun: a stand-in transformers package fails.
    shim = tmp_path / "shim" / "transformers"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text(
        "raise ImportError('the model must not load on a finished job')"
    )
    job = ref_out.parent / "out.yaml"
    p = run(job, PYTHONPATH=str(shim.parent))
    assert p.returncode == 0, p.stderr[-2000:]
    assert summary(p.stdout)["status"] == "nothing_to_do"
    assert "loaded " not in p.stderr
    assert _digest(ref_out) == before


def test_changed_job_is_refused_with_78(tmp_path):
    job = write_job(tmp_path, "static", write_input(tmp_path / "in.jsonl"))
    cfg = load_job(job)
    rd = RunDir(cfg.output.path, "jsonl")
    with open_run(rd, cfg, RunOptions()) as (m, _, _):  # this job, unfinished, one row in
        rd.commit(m, [{"id": "r00", "completion": "c", "finish_reason": "stop"}], [])
    r = CliRunner().invoke(app, ["run", str(job), "--set", "generation.max_new_tokens=7"])
    assert r.exit_code == 78, r.output
    assert "generation.max_new_tokens: 6 -> 7" in r.output
    assert json.loads(r.stdout.strip().splitlines()[-1])["exit_code"] == 78


def test_a_run_directory_with_no_row_committed_takes_a_changed_job(tmp_path):
    job = write_job(tmp_path, "static", write_input(tmp_path / "in.jsonl"))
    cfg = load_job(job)
    with open_run(RunDir(cfg.output.path, "jsonl"), cfg, RunOptions()):
        pass  # stopped before its first commit (a mistake in the job file, found at start)
    changed = load_job(job, ["generation.max_new_tokens=7"])
    with open_run(RunDir(cfg.output.path, "jsonl"), changed, RunOptions()) as (m, done, _):
        assert not done and m.job["generation"]["max_new_tokens"] == 7


def test_changed_job_is_refused_even_when_the_run_is_finished(tmp_path):
    ref_out, _ = reference("static")
    r = CliRunner().invoke(
        app, ["run", str(ref_out.parent / "out.yaml"), "--set", "input.system_prompt=Be brief."]
    )
    assert r.exit_code == 78, r.output
    assert "holds a different job; changed since it started:\n  prompt.system_prompt" in r.output


def test_a_held_lock_names_its_holder(tmp_path):
    job = write_job(tmp_path, "static", write_input(tmp_path / "in.jsonl"))
    out = tmp_path / "out"
    out.mkdir()
    with open(out / ".lock", "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        f.write("jobrunner pid 4242 on somehost")
        f.flush()
        r = CliRunner().invoke(app, ["run", str(job)])
    assert r.exit_code == 78, r.output
    assert "is being run by jobrunner pid 4242 on somehost" in r.output


def test_a_killed_holder_leaves_no_stale_lock(tmp_path):
    job = write_job(tmp_path, "static", write_input(tmp_path / "in.jsonl"))
    cfg = load_job(job)
    rundir = RunDir(cfg.output.path, "jsonl")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import sys, time; from jobrunner.config import load_job; from jobrunner.io.rundir import"
                " RunDir; from jobrunner.pipeline import RunOptions; from jobrunner.resume import open_run;"
                f" cfg = load_job({str(job)!r});"
                " ctx = open_run(RunDir(cfg.output.path, 'jsonl'), cfg, RunOptions()); ctx.__enter__();"
                " print('locked', flush=True); time.sleep(600)"
            ),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "locked"
    from jobrunner.errors import RunLocked

    with pytest.raises(RunLocked, match=f"pid {holder.pid} "), open_run(rundir, cfg, RunOptions()):
        pass
    kill9(holder)
    with open_run(rundir, cfg, RunOptions()) as (manifest, skip, total):
        assert total == 26 and skip == set()
