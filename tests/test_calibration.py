"""Calibration: the rows it runs span the job's prompt lengths and reach long prompts, and a step
model fitted on the steps they make recovers the device's cost, long prompts included."""

from __future__ import annotations

import random

import pytest

from jobrunner.calibration import (
    LONG_ID,
    LONG_NEW_TOKENS,
    LONG_PROMPT_TOKENS,
    calibration_groups,
    completion_share,
    spread_by_length,
)
from jobrunner.telemetry.simulate import replay, step_log
from jobrunner.telemetry.throughput import StepModel, fit_step_model
from jobrunner.types import Request, SamplingParams, Usage

BLOCK = 16


def _request(i: int, length: int, new: int = 64, ignore_eos: bool = False) -> Request:
    ids = [1000 + 7 * i + j for j in range(length)]
    return Request(f"r{i}", ids, SamplingParams(max_new_tokens=new, ignore_eos=ignore_eos))


def test_the_sample_spans_the_lengths_shortest_and_longest_included():
    pool = [_request(i, n) for i, n in enumerate([40, 7, 300, 55, 12, 90, 18, 250, 33, 61])]
    picked = spread_by_length(pool, 4)
    assert [r.num_prompt_tokens for r in picked] == [7, 33, 61, 300]
    assert spread_by_length(pool[:3], 8) == sorted(pool[:3], key=lambda r: r.num_prompt_tokens)
    assert [r.num_prompt_tokens for r in spread_by_length(pool, 1)] == [300]


def test_groups_run_short_and_long_rows_apart_and_a_long_prompt_where_the_job_has_none():
    sample = [_request(i, n) for i, n in enumerate([20, 30, 45, 60, 80, 100, 120, 150])]
    short, long, everything = calibration_groups(sample, max_model_len=4096)
    assert [r.num_prompt_tokens for r in short] == [20, 30]
    assert [r.num_prompt_tokens for r in long[:2]] == [120, 150]
    assert sorted(everything, key=id) == sorted(sample, key=id)
    (stretched,) = long[2:]
    assert stretched.num_prompt_tokens == LONG_PROMPT_TOKENS
    assert stretched.id.endswith(LONG_ID) and stretched.id not in {r.id for r in sample}
    assert stretched.sampling.ignore_eos and stretched.sampling.max_new_tokens == LONG_NEW_TOKENS
    # its first block is no sampled prompt's first block: the prefix cache cannot serve it
    firsts = {tuple(r.prompt_token_ids[:BLOCK]) for r in sample}
    assert tuple(stretched.prompt_token_ids[:BLOCK]) not in firsts


def test_the_long_prompt_fits_the_context_and_is_left_out_when_the_job_has_long_prompts():
    sample = [_request(i, n) for i, n in enumerate([20, 60])]
    _, long, _ = calibration_groups(sample, max_model_len=512)
    assert long[-1].num_prompt_tokens + LONG_NEW_TOKENS < 512
    own = [_request(i, n) for i, n in enumerate([20, 60, LONG_PROMPT_TOKENS + 5])]
    assert all(LONG_ID not in r.id for g in calibration_groups(own, 4096) for r in g)


def test_the_completion_share_counts_rows_that_may_stop_only():
    sample = [_request(0, 10, new=10), _request(1, 10, new=10, ignore_eos=True)]

    class R:
        ok = True

        def __init__(self, rid, n):
            self.id, self.usage = rid, Usage(prompt_tokens=10, completion_tokens=n)

    assert completion_share(sample, [R("r0", 4), R("r1", 10)]) == pytest.approx(0.4)
    assert completion_share(sample[1:], [R("r1", 10)]) is None


# A device whose steps cost exactly this (plus noise): prefill attention matters at long prompts.
TRUE = StepModel(
    step_s=0.03,
    token_s=0.002,
    load_s=0.0,
    source="test",
    decode_token_s=0.0015,
    context_token_s=2e-6,
    prefill_context_s=4e-6,
)


def _measured(groups: list[list[Request]], rng: random.Random) -> list[dict]:
    """The steps each group makes under the scheduler's rules, timed by TRUE within 5%."""
    rows = [[(r.num_prompt_tokens,) * 2 + (r.sampling.max_new_tokens,) for r in g] for g in groups]
    steps = [s for g in rows for s in step_log(g, TRUE, 256, 8192, BLOCK)]
    return [{**s, "step_seconds": s["step_seconds"] * rng.uniform(0.95, 1.05)} for s in steps]


def test_a_fit_on_short_rows_calibration_predicts_a_job_of_long_prompts():
    rng = random.Random(0)
    sample = [_request(i, rng.randint(15, 150)) for i in range(8)]  # a job of short prompts
    fit = fit_step_model(_measured(calibration_groups(sample, 4096), rng), load_s=0.0, rows=8)
    long_job = [(n, n, 32) for n in (rng.randint(100, 400) for _ in range(16))]
    want = replay(long_job, TRUE, 256, 8192).forward_seconds
    got = replay(long_job, fit, 256, 8192).forward_seconds
    assert got == pytest.approx(want, rel=0.05)
    for term in ("token_s", "decode_token_s", "prefill_context_s"):
        assert getattr(fit, term) == pytest.approx(getattr(TRUE, term), rel=0.25), term
