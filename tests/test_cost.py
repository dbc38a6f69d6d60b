"""The cost model: shares add up, cached prompt tokens are free, duplicates split one cost."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jobrunner.telemetry.breakdown import run_phases, split_step
from jobrunner.telemetry.cost import DEFAULT_DECODE_WEIGHT as W
from jobrunner.telemetry.cost import share_cost
from jobrunner.telemetry.prices import API_PRICES, api_equivalent
from jobrunner.telemetry.throughput import StepModel, fit_step_model
from jobrunner.types import FinishReason, Result, Usage


def row(prompt: int, cached: int = 0, completion: int = 0, shared_with: int = 1, rid: str = "r"):
    return Result(
        rid, "", FinishReason.STOP, Usage(prompt, cached, completion), shared_with=shared_with
    )


def test_cached_prompt_tokens_cost_nothing():
    # 64 prompt tokens of which 48 cached computes exactly what a 16-token prompt computes.
    a, b = row(64, cached=48, completion=10), row(16, completion=10)
    saved = share_cost([a, b], usd=1.0)
    assert a.usage.cost_usd == pytest.approx(0.5)
    assert b.usage.cost_usd == pytest.approx(0.5)
    # The rate is 1 USD per (2 * (16 + W*10)) units; the 48 cached tokens would have cost 48 units.
    assert saved.cache_usd == pytest.approx(48 / (2 * (16 + W * 10)))
    assert saved.dedup_usd == 0.0


def test_duplicates_split_one_computation():
    leader = row(20, completion=5, shared_with=2, rid="a")
    follower = row(20, completion=5, shared_with=2, rid="b")
    other = row(20, completion=5, rid="c")
    saved = share_cost([leader, follower, other], usd=0.9)
    # Two computations happened (the pair's and the other's): each costs 0.45; the pair halves theirs.
    assert leader.usage.cost_usd == pytest.approx(0.225)
    assert follower.usage.cost_usd == pytest.approx(0.225)
    assert other.usage.cost_usd == pytest.approx(0.45)
    assert saved.dedup_usd == pytest.approx(0.45)  # the computation the follower did not need


def test_decode_steps_cost_decode_weight_prefill_tokens():
    prefill_only, decode_only = row(int(W * 8)), row(1, cached=0, completion=8)
    share_cost([prefill_only, decode_only], usd=1.0)
    # 32 prefill tokens vs 1 + 4*8 = 33 units
    assert prefill_only.usage.cost_usd == pytest.approx(32 / 65)


@given(
    st.lists(
        st.tuples(st.integers(1, 500), st.integers(0, 400), st.integers(0, 64), st.integers(1, 4)),
        min_size=1,
        max_size=30,
    ),
    st.floats(0.0, 100.0),
)
def test_shares_add_up_to_the_interval_cost(rows, usd):
    results = [row(p, min(c, p - 1), n, k) for p, c, n, k in rows]
    share_cost(results, usd)
    assert sum(r.usage.cost_usd for r in results) == pytest.approx(usd, rel=1e-9, abs=1e-12)
    assert all(r.usage.cost_usd >= 0 for r in results)


def test_step_time_is_split_by_work_and_phases_add_up_to_wall():
    step = {"step_seconds": 2.0, "prefill_tokens": 8, "decode_tokens": 2}
    assert split_step(step) == pytest.approx({"prefill": 2.0 * 8 / 16, "decode": 2.0 * 8 / 16})
    run = {"wall_seconds": 10.0, "load_seconds": 3.0, "engine_seconds": 5.0}
    phases = run_phases(run, [step, {"step_seconds": 1.0, "prefill_tokens": 0, "decode_tokens": 3}])
    assert phases["decode"] == pytest.approx(2.0)
    assert phases["engine"] == pytest.approx(2.0)
    assert phases["other"] == pytest.approx(2.0)
    assert sum(phases.values()) == pytest.approx(10.0)


def test_fit_recovers_step_and_token_time():
    steps = [{"batch_tokens": n, "step_seconds": 0.05 + 0.001 * n} for n in (4, 16, 64, 200, 8)]
    m = fit_step_model(steps, load_s=1.5, rows=5)
    assert m.step_s == pytest.approx(0.05)
    assert m.token_s == pytest.approx(0.001)
    assert m.source.startswith("calibrated: 5 sampled rows, 5 engine steps")


def test_fit_separates_fixed_prefill_and_per_sequence_decode_time():
    def step(p, d):
        return {
            "batch_tokens": p + d,
            "prefill_tokens": p,
            "decode_tokens": d,
            "step_seconds": 0.2 + 0.001 * p + 0.03 * d,
        }

    m = fit_step_model(
        [step(300, 0), step(40, 2), step(0, 2), step(0, 6), step(0, 5), step(120, 4)],
        load_s=1.0,
        rows=6,
    )
    assert (m.step_s, m.token_s, m.decode_token_s, m.context_token_s) == pytest.approx(
        (0.2, 0.001, 0.03, 0.0), abs=1e-9
    )
    # A fit that wants a negative coefficient drops that term instead.
    m = fit_step_model(
        [
            {
                "batch_tokens": 1,
                "prefill_tokens": 0,
                "decode_tokens": d,
                "step_seconds": 1.0 - 0.1 * d,
            }
            for d in (1, 2, 3)
        ],
        load_s=0.0,
        rows=3,
    )
    assert m.decode_token_s == 0.0 and m.step_s == pytest.approx(0.8)


def test_fit_finds_the_attention_cost_of_long_contexts():
    def step(d, blocks):
        return {
            "batch_tokens": d,
            "prefill_tokens": 0,
            "decode_tokens": d,
            "kv_blocks_used": blocks,
            "step_seconds": 0.1 + 0.02 * d + 0.0005 * blocks * 16,
        }

    m = fit_step_model(
        [step(2, 100), step(2, 110), step(4, 40), step(4, 60), step(3, 200)],
        load_s=0.0,
        rows=4,
        block_size=16,
    )
    assert (m.step_s, m.decode_token_s, m.context_token_s) == pytest.approx((0.1, 0.02, 0.0005))
    # Two rows of 100 prompt tokens, 10 new tokens each: 2 * 10 * (100 + 5) context-token steps.
    m = StepModel(
        step_s=0.0, token_s=0.0, load_s=0.0, source="t", decode_token_s=0.0, context_token_s=0.001
    )
    assert m.forward_seconds(0, [10, 10], 8, prompts=[100, 100]) == pytest.approx(2.1)


def test_forward_seconds_follows_continuous_batching():
    m = StepModel(step_s=0.1, token_s=0.01, load_s=0.0, source="test")
    # 8 rows of 10 tokens, 4 at a time: 20 decode steps; 100 prompt + 80 completion tokens.
    assert m.forward_seconds(100, [10] * 8, max_num_seqs=4) == pytest.approx(20 * 0.1 + 180 * 0.01)
    # Fewer rows than slots: the longest completion sets the step count.
    assert m.forward_seconds(0, [3, 30], max_num_seqs=64) == pytest.approx(30 * 0.1 + 33 * 0.01)
    m = StepModel(step_s=0.1, token_s=0.01, load_s=0.0, source="test", decode_token_s=0.05)
    assert m.forward_seconds(100, [10] * 8, max_num_seqs=4) == pytest.approx(2.0 + 1.0 + 80 * 0.05)


def test_api_equivalent_prices_the_same_tokens():
    out = api_equivalent(2_000_000, 1_000_000, own_usd=1.0)
    assert [a["model"] for a in out] == [p.model for p in API_PRICES]
    mini = next(a for a in out if a["model"] == "gpt-4o-mini")
    assert mini["usd"] == pytest.approx(2 * 0.075 + 0.30)
    assert mini["ratio_to_ours"] == pytest.approx(mini["usd"])
    assert all(a["date"] and a["source"] for a in out)


def test_cost_model_and_reports_import_no_torch():
    code = (
        "import sys, jobrunner.telemetry.cost, jobrunner.telemetry.report, "
        "jobrunner.telemetry.prom, jobrunner.telemetry.throughput, jobrunner.telemetry.sampler; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
