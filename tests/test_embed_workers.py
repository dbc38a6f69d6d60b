"""Encoder batches on several single-threaded workers (engine/embed/workers.py)."""

from __future__ import annotations

import time

import pytest
import torch

from jobrunner.engine.embed.workers import SharedClock, in_workers


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


def test_overlapping_work_shares_the_wall_time_it_ran_in():
    now = [0.0]
    clock = SharedClock(lambda: now[0])
    a = clock.start()
    now[0] = 1.0
    b = clock.start()  # a and b run together from 1 to 3
    now[0] = 3.0
    assert clock.stop(a) == pytest.approx(2.0)  # 1 s alone, then half of 2 s
    now[0] = 4.0
    c = clock.start()
    now[0] = 6.0
    assert clock.stop(b) == pytest.approx(1.0 + 1.0 + 1.0)  # half of 1-3, alone 3-4, half of 4-6
    now[0] = 10.0  # c alone from 6 to 10
    assert clock.stop(c) == pytest.approx(1.0 + 4.0)
    # the seconds add up to the time anything ran (0 to 10), never to the sum of durations (13)


def test_an_embed_job_on_two_workers_bills_no_more_than_the_wall_clock():
    """The engine's forward time and the rows' device seconds are wall time shared by the
    batches that ran at once: with 2 workers, their durations add up to about twice it."""
    from jobrunner.config import JobConfig, ModelConfig
    from jobrunner.engine.engines import make_engine
    from jobrunner.engine.loader import load_model
    from jobrunner.prep.embed import EMBED_SAMPLING
    from jobrunner.types import Request
    from tests.test_embed import mixed_texts

    loaded = load_model(ModelConfig(source="all-minilm-l6-v2", dtype="float32"))
    cfg = JobConfig.model_validate(
        {"task": "embed", "embedding": {"cpu_workers": 2}, "engine": {"max_batch_tokens": 400}}
    )
    engine = make_engine(loaded, cfg)
    ids = loaded.tokenizer(mixed_texts(96))["input_ids"]
    results = list(engine.generate([Request(str(i), x, EMBED_SAMPLING) for i, x in enumerate(ids)]))
    st = engine.stats
    assert len(results) == 96 and st.steps >= 8 and engine.workers == 2
    assert 0 < st.forward_seconds <= st.engine_seconds
    billed = sum(r.usage.device_seconds for r in results)
    assert billed == pytest.approx(st.forward_seconds, rel=1e-6)
