"""The run lock between `run` and `report` (io/run_lock.py), with a real second process
holding it: a report never writes into a run in progress (75), and a run that starts while a
report writes waits for it instead of being refused. No model: the lock is taken by open_run."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

from crashkit import kill9, write_input, write_job
from typer.testing import CliRunner

from jobrunner.cli import app
from jobrunner.config import load_job
from jobrunner.io.rundir import RunDir
from jobrunner.pipeline import RunOptions
from jobrunner.resume import open_run

REPORTS = ("report.json", "report.md", "report.html", "metrics.prom")


def a_run_dir(tmp_path: Path):
    """A run directory with a manifest and one committed row, as a run leaves it."""
    job = write_job(tmp_path, "static", write_input(tmp_path / "in.jsonl", n=3, bad=False))
    cfg = load_job(job)
    rundir = RunDir(cfg.output.path, "jsonl")
    with open_run(rundir, cfg, RunOptions()) as (manifest, _, _):
        rec = {"id": "r00", "completion": "c", "finish_reason": "stop", "prompt_tokens": 1}
        rundir.commit(manifest, [rec], [])
    return job, cfg, rundir


def hold(code: str) -> subprocess.Popen:
    """Another process that runs `code` (which takes a lock), says so, and keeps it."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"{code}; print('locked', flush=True); import time; time.sleep(600)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline().strip() == "locked"
    return proc


def snapshot(d: Path) -> dict[str, bytes]:
    """Every file's bytes but the locks' (the holders write their pids there)."""
    files = (p for p in sorted(d.rglob("*")) if p.is_file() and not p.name.endswith(".lock"))
    return {str(p.relative_to(d)): p.read_bytes() for p in files}


def report(out: Path) -> tuple[int, dict]:
    r = CliRunner().invoke(app, ["report", str(out)])
    return r.exit_code, json.loads(r.stdout.strip().splitlines()[-1])


def test_report_on_a_run_in_progress_exits_75_and_writes_nothing(tmp_path):
    job, cfg, rundir = a_run_dir(tmp_path)
    out = rundir.path
    running = hold(
        "from jobrunner.config import load_job; from jobrunner.io.rundir import RunDir;"
        " from jobrunner.pipeline import RunOptions; from jobrunner.resume import open_run;"
        f" cfg = load_job({str(job)!r}); held = open_run(RunDir(cfg.output.path, 'jsonl'), cfg,"
        " RunOptions()); held.__enter__()"
    )
    try:
        before = snapshot(out)
        code, summary = report(out)
        assert (code, summary["exit_code"]) == (75, 75)
        assert summary["error"] == (
            f"{out}: a run is in progress (jobrunner pid {running.pid} on {socket.gethostname()}"
            " holds its lock, 1 row committed so far); its reports are written as it ends."
            " Try again when it ends"
        )
        assert snapshot(out) == before and not any((out / n).exists() for n in REPORTS)
    finally:
        kill9(running)
    code, summary = report(out)  # the run ended (killed): the lock is free
    assert code == 0 and summary["rows"]["succeeded"] == 1
    assert all((out / n).is_file() for n in REPORTS)


def test_a_run_starting_while_a_report_writes_waits_for_it(tmp_path):
    _, cfg, rundir = a_run_dir(tmp_path)
    writing = hold(
        "from pathlib import Path; from jobrunner.io.run_lock import report_lock;"
        f" held = report_lock(Path({str(rundir.path)!r}), 'out'); held.__enter__()"
    )
    try:
        waiter = subprocess.Popen(  # a run starting meanwhile: it waits, it is not refused
            [
                sys.executable,
                "-c",
                "import logging, sys; logging.basicConfig(level='INFO', stream=sys.stdout);"
                " from jobrunner.config import load_job; from jobrunner.io.rundir import RunDir;"
                " from jobrunner.pipeline import RunOptions; from jobrunner.resume import open_run;"
                f" cfg = load_job({cfg.source_file!r});"
                " ctx = open_run(RunDir(cfg.output.path, 'jsonl'), cfg, RunOptions());"
                " ctx.__enter__(); print('started', flush=True)",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        said = next((x for x in waiter.stdout if "waiting for `jobrunner report`" in x), "")
        assert "to finish writing" in said  # (at its end of output: it did not wait)
        time.sleep(0.5)
        assert waiter.poll() is None  # still waiting while the report holds the lock
    finally:
        kill9(writing)  # the report ends (here: its process, and the locks with it)
    out, err = waiter.communicate(timeout=60)
    assert waiter.returncode == 0 and out.strip().endswith("started"), err[-2000:]


def test_a_rerun_of_a_finished_job_writes_nothing_while_another_run_holds_it(tmp_path):
    """A finished run's rerun completes what a crash left undone (here: a missing report) only
    under the run lock: while a run (--retry-errors, --restart) holds the directory it is
    refused (78) and writes nothing; once the lock is free it completes the directory."""
    from crashkit import CLI, env

    job = write_job(tmp_path, "static", write_input(tmp_path / "in.jsonl", n=3, bad=False))
    cfg = load_job(job)
    out = Path(cfg.output.path)
    first = subprocess.run([*CLI, "run", str(job)], capture_output=True, text=True, env=env())
    assert first.returncode == 0, first.stderr[-2000:]
    (out / "report.md").unlink()
    running = hold(
        f"from pathlib import Path; from jobrunner.io.run_lock import run_lock;"
        f" held = run_lock(Path({str(out)!r})); held.__enter__()"
    )
    try:
        before = snapshot(out)
        again = subprocess.run([*CLI, "run", str(job)], capture_output=True, text=True, env=env())
        assert again.returncode == 78 and "is being run by" in again.stderr, again.stderr[-2000:]
        assert snapshot(out) == before and not (out / "report.md").exists()
    finally:
        kill9(running)
    again = subprocess.run([*CLI, "run", str(job)], capture_output=True, text=True, env=env())
    assert again.returncode == 0 and (out / "report.md").is_file(), again.stderr[-2000:]


def test_a_finished_run_directory_we_may_not_write_still_answers_its_outcome(tmp_path):
    """Another user's finished results (or a read-only mount): a rerun answers nothing_to_do,
    as it did before reruns took the run lock; it cannot take the lock, and writes nothing."""
    from crashkit import CLI, env, run_as_nobody

    job = write_job(tmp_path, "static", write_input(tmp_path / "in.jsonl", n=3, bad=False))
    out = Path(load_job(job).output.path)
    first = subprocess.run([*CLI, "run", str(job)], capture_output=True, text=True, env=env())
    assert first.returncode == 0, first.stderr[-2000:]
    for p in tmp_path.rglob("*"):
        p.chmod(0o755 if p.is_dir() else 0o644)  # others may read, not write
    before = snapshot(out)
    again = run_as_nobody(["run", str(job)], tmp_path)
    assert again.returncode == 0, again.stderr[-2000:]
    assert json.loads(again.stdout.strip().splitlines()[-1])["status"] == "nothing_to_do"
    assert snapshot(out) == before
