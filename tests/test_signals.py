"""SIGTERM and SIGINT (promise 7): stop admitting, commit what is finished, exit 75 in time;
a second signal exits at once; a signal during start-up exits 75 too. Every rerun completes."""

from __future__ import annotations

import json
import signal
import time

import pytest
from crashkit import (
    assert_complete_files,
    assert_each_row_once,
    comparable,
    read_results,
    reference,
    run,
    start,
    summary,
    wait_for_shards,
    write_input,
    write_job,
)

pytestmark = pytest.mark.slow
# DESIGN.md promise 7: exit 75 within seconds (the issue says 10). The wait is a bound on a
# hang, not a speed measurement: on a loaded 2-core runner a model load alone takes longer.
PROMISED_SECONDS = 60


def _finish_and_compare(job, out, engine: str) -> None:
    p = run(job)
    assert p.returncode == 0, p.stderr[-2000:]
    assert_each_row_once(out)
    assert comparable(out) == reference(engine)[1]


def test_sigterm_commits_finished_rows_and_exits_75(tmp_path):
    job = write_job(tmp_path, "paged", write_input(tmp_path / "in.jsonl"))
    out = tmp_path / "out"
    proc = start(job)
    wait_for_shards(proc, out / "results", more_than=0)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=PROMISED_SECONDS)
    assert proc.returncode == 75, stderr[-2000:]
    assert summary(stdout)["exit_code"] == 75
    assert "rows committed" in summary(stdout)["error"]
    assert_complete_files(out)
    assert_each_row_once(out)
    manifest = json.loads((out / "manifest.json").read_text())
    assert sum(s["rows"] for s in manifest["shards"]) == len(read_results(out)) >= 4
    assert not (out / "_SUCCESS").exists()
    _finish_and_compare(job, out, "paged")


def test_second_signal_exits_at_once(tmp_path):
    job = write_job(tmp_path, "static", write_input(tmp_path / "in.jsonl"))
    out = tmp_path / "out"
    proc = start(job)
    wait_for_shards(proc, out / "results", more_than=0)
    proc.send_signal(signal.SIGTERM)
    proc.send_signal(signal.SIGINT)  # the second: no waiting for the batch in flight
    stdout, stderr = proc.communicate(timeout=PROMISED_SECONDS)
    assert proc.returncode == 75, stderr[-2000:]
    assert summary(stdout)["error"].startswith("interrupted; run the same command again")
    assert_complete_files(out)
    assert_each_row_once(out)
    _finish_and_compare(job, out, "static")


def test_sigterm_during_start_up_exits_75(tmp_path):
    job = write_job(tmp_path, "static", write_input(tmp_path / "in.jsonl"))
    out = tmp_path / "out"
    proc = start(job)
    while not (out / "manifest.json").exists():  # the run directory is open: scan or load
        assert proc.poll() is None, proc.stderr.read()[-2000:]
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=PROMISED_SECONDS)
    assert proc.returncode == 75, stderr[-2000:]
    assert summary(stdout)["exit_code"] == 75
    assert_complete_files(out)


def test_sigterm_swallowed_by_a_library_during_model_load_still_stops(tmp_path, monkeypatch):
    """Library code with a broad `except Exception` (model loading has some) can swallow the
    exception SIGTERM raises during start-up; the job must stop anyway, not run to the end."""
    import os

    from jobrunner.config import load_job
    from jobrunner.engine import loader
    from jobrunner.errors import Interrupted
    from jobrunner.pipeline import run_job

    real_load = loader.load_model

    def load_that_swallows(*args, **kwargs):
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler raises in here
        except Exception:
            pass
        return real_load(*args, **kwargs)

    monkeypatch.setattr(loader, "load_model", load_that_swallows)
    job = write_job(tmp_path, "static", write_input(tmp_path / "in.jsonl"))
    with pytest.raises(Interrupted, match="signal 15"):
        run_job(load_job(job))
    assert not (tmp_path / "out" / "_SUCCESS").exists()
    assert not list((tmp_path / "out" / "results").glob("*"))  # no row was generated
