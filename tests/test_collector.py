"""Start-up runs without collections; a run collects garbage less often and never walks what
existed before it (collector.py); afterwards the process is as it was, so a process running
several jobs keeps no garbage."""

from __future__ import annotations

import gc
import sys

import pytest

from jobrunner import collector
from jobrunner.collector import YOUNG_THRESHOLD, settled


@pytest.fixture(autouse=True)
def collector_on():
    """A failed test leaves no paused collector to the ones after it."""
    yield
    collector.resume()
    gc.enable()


def test_settled_freezes_raises_the_threshold_and_restores_both():
    before = gc.get_threshold()
    with settled():
        assert gc.get_freeze_count() > 0
        assert gc.get_threshold()[0] >= YOUNG_THRESHOLD
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_garbage_made_during_a_run_is_still_collected():
    import weakref

    class Node:
        pass

    with settled():
        a, b = Node(), Node()
        a.other, b.other = b, a  # a cycle: only the collector frees it
        gone = weakref.ref(a)
        del a, b
        gc.collect()
        assert gone() is None


def test_start_up_runs_without_collections_and_turns_them_back_on(monkeypatch):
    """The imports and the load make long-lived objects, not garbage: start_engine loads with
    the collector off (no full walks of torch and transformers), and on again afterwards, a
    failed load included."""
    from jobrunner.config import JobConfig
    from jobrunner.engine import loader, start

    seen = []

    def load(cfg):
        seen.append(gc.isenabled())
        raise RuntimeError("stop here")

    monkeypatch.setattr(loader, "load_model", load)
    assert gc.isenabled()
    with pytest.raises(RuntimeError, match="stop here"):
        start.start_engine(JobConfig())
    assert seen == [False]
    assert gc.isenabled()


def test_run_starts_up_without_collections_and_other_commands_keep_them(tmp_path, monkeypatch):
    """`jobrunner run` pauses the collector for its start-up and turns it on again however it
    ends; a command that reads rows (validate) never pauses it."""
    from jobrunner import cli, errors, executors

    seen = []

    def run_with_executor(cfg, opts):
        seen.append(gc.isenabled())
        raise errors.ConfigError("stop here")

    monkeypatch.setattr(cli, "_load", lambda job, set_, executor=None: object())
    monkeypatch.setattr(executors, "run_with_executor", run_with_executor)
    monkeypatch.setattr(sys, "argv", ["jobrunner", "run", str(tmp_path / "job.yaml")])
    with pytest.raises(SystemExit) as exit_:
        cli.main()
    assert exit_.value.code == errors.ConfigError.exit_code
    assert seen == [False]
    assert gc.isenabled()

    def load(job, set_, executor=None):
        seen.append(gc.isenabled())
        raise errors.ConfigError("stop here")

    monkeypatch.setattr(cli, "_load", load)
    monkeypatch.setattr(sys, "argv", ["jobrunner", "validate", str(tmp_path / "job.yaml")])
    with pytest.raises(SystemExit) as exit_:
        cli.main()
    assert exit_.value.code == errors.ConfigError.exit_code
    assert seen == [False, True]
