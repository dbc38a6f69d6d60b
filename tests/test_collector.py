"""A run collects garbage less often and never walks what existed before it (collector.py);
afterwards the process is as it was, so a process running several jobs keeps no garbage."""

from __future__ import annotations

import gc

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
