"""Encoder batches on several single-threaded workers (engine/embed/workers.py)."""

from __future__ import annotations

import time

import pytest
import torch

from jobrunner.engine.embed.workers import in_workers


def test_results_come_back_in_item_order_when_later_items_finish_first():
    def run(i: int) -> list[tuple[int, int]]:
        time.sleep(0.05 if i % 3 == 0 else 0.0)  # every third item is the slow one
        return [(i, torch.get_num_threads()), (i, torch.get_num_threads())]

    got = list(in_workers(run, range(10), workers=2))
    assert [i for i, _ in got] == [i // 2 for i in range(20)]
    assert {threads for _, threads in got} == {1}  # each worker runs its batch on one thread


def test_torch_threads_are_restored_after_the_workers_and_after_an_error():
    before = torch.get_num_threads()
    assert list(in_workers(lambda i: [i], range(3), workers=2)) == [0, 1, 2]
    assert torch.get_num_threads() == before

    def fail(i: int) -> list[int]:
        raise ValueError(f"row {i}")

    with pytest.raises(ValueError, match="row 0"):
        list(in_workers(fail, range(3), workers=2))
    assert torch.get_num_threads() == before
