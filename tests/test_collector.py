"""Start-up runs without collections; a run collects garbage less often and never walks what
existed before it (collector.py); afterwards the process is as it was, so a process running
several jobs keeps no garbage."""

from __future__ import annotations

import gc
import sys

import pytest

from jobrunner.collector import YOUNG_THRESHOLD, settled


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


def test_the_cli_leaves_the_collector_on_after_any_command(tmp_path, monkeypatch):
    from jobrunner.cli import main

    for argv in (["--help"], ["validate", str(tmp_path / "missing.yaml")]):
        monkeypatch.setattr(sys, "argv", ["jobrunner", *argv])
        with pytest.raises(SystemExit):
            main()
        assert gc.isenabled()
