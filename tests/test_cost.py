"""The cost model: shares add up, cached prompt tokens are free, duplicates split one cost."""

from __future__ import annotations

import datetime as dt
import json
import math
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobrunner.config import CostConfig
from jobrunner.telemetry.breakdown import run_phases, split_step
from jobrunner.telemetry.cost import CostLedger, own_seconds
from jobrunner.telemetry.device import DeviceInfo, cpu_family
from jobrunner.telemetry.prices import (
    API_PRICES,
    api_equivalent,
    api_prices,
    device_rate,
    price_warnings,
)
from jobrunner.telemetry.record import RunRecord
from jobrunner.telemetry.throughput import StepModel, fit_step_model
from jobrunner.types import Choice, FinishReason, Result, Usage


def row(work: int, seconds: float = 0.0, cached: int = 0, shared_with: int = 1, rid: str = "r"):
    u = Usage(prompt_tokens=work + cached, cached_tokens=cached, prefill_tokens=work)
    u.device_seconds = seconds
    return Result(rid, [Choice(0, "", [], FinishReason.STOP)], u, shared_with=shared_with)


def test_a_row_pays_its_own_steps_whenever_it_finishes():
    # $3600/h is $1/s. Two rows ran 2 s and 1 s of steps; the clock shows only step time.
    ledger = CostLedger(3600.0, expected_rows=2, start=0.0)
    a, b = row(30, seconds=2.0), row(10, seconds=1.0)
    ledger.price([a], measured_seconds=3.0, now=3.0)  # b is still in flight: its steps are its
    ledger.price([b], measured_seconds=3.0, now=3.0, final=True)
    assert (a.usage.cost_usd, b.usage.cost_usd) == pytest.approx((2.0, 1.0))
    assert ledger.cost_usd == pytest.approx(3.0)


def test_load_time_is_spread_over_all_rows_by_work_not_paid_by_the_first():
    # 10 s of load, then ten rows of equal work, 1 s of steps each, committed one by one.
    ledger = CostLedger(3600.0, expected_rows=10, start=0.0)
    rows = [row(50, seconds=1.0, rid=str(i)) for i in range(10)]
    for i, r in enumerate(rows):
        ledger.price([r], measured_seconds=i + 1.0, now=10.0 + i + 1, final=i == 9)
    assert [r.usage.cost_usd for r in rows] == pytest.approx([2.0] * 10)
    assert ledger.cost_usd == pytest.approx(20.0)


def test_cached_prompt_tokens_are_saved_at_the_rate_paid():
    ledger = CostLedger(3600.0, start=0.0)
    a, b = row(16, seconds=0.5, cached=48), row(16, seconds=0.5)
    saved = ledger.price([a, b], measured_seconds=1.0, now=1.0, final=True)
    assert a.usage.cost_usd == pytest.approx(b.usage.cost_usd) == pytest.approx(0.5)
    assert saved.cache_usd == pytest.approx(48 * 1.0 / 32)  # $1 bought 32 computed tokens
    assert saved.dedup_usd == 0.0


def test_duplicates_split_one_computation():
    ledger = CostLedger(3600.0, start=0.0)
    leader = row(20, seconds=0.5, shared_with=2, rid="a")
    follower = row(20, seconds=0.5, shared_with=2, rid="b")  # a copy of the leader's usage
    other = row(20, seconds=0.5, rid="c")
    saved = ledger.price([leader, follower, other], measured_seconds=1.0, now=1.0, final=True)
    # Two computations happened, 0.5 s each: the pair halves theirs.
    assert leader.usage.cost_usd == pytest.approx(0.25)
    assert follower.usage.cost_usd == pytest.approx(0.25)
    assert other.usage.cost_usd == pytest.approx(0.5)
    assert saved.dedup_usd == pytest.approx(0.5)  # the computation the follower did not need
    assert saved.dedup_prompt_tokens == pytest.approx(20)  # the follower's prompt, not computed


@settings(deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 500),  # work tokens
            st.floats(0.0, 5.0),  # own step seconds
            st.integers(1, 3),  # shared_with
            st.floats(0.0, 3.0),  # idle seconds before the row finishes
            st.booleans(),  # commit after this row
        ),
        min_size=1,
        max_size=40,
    ),
    st.floats(0.0, 30.0),  # load seconds
    st.floats(0.01, 50.0),  # usd per hour
    st.integers(0, 60),  # expected rows (right or wrong)
)
def test_rows_add_up_to_the_job_total_and_the_wall_time(rows, load, usd_per_hour, expected):
    ledger = CostLedger(usd_per_hour, expected_rows=expected, start=100.0)
    now, measured, pending, priced = 100.0 + load, 0.0, [], []
    for i, (work, secs, k, idle, commit) in enumerate(rows):
        r = row(work, seconds=secs * k, shared_with=k, rid=str(i))  # k copies split secs * k
        now, measured = now + secs + idle, measured + secs
        pending.append(r)
        last = i == len(rows) - 1
        if commit or last:
            ledger.price(pending, measured, now, final=last)
            priced, pending = priced + pending, []
    costs = [r.usage.cost_usd for r in priced]
    assert math.fsum(costs) == pytest.approx(ledger.cost_usd, rel=1e-12, abs=1e-15)
    assert ledger.cost_usd == pytest.approx((now - 100.0) * usd_per_hour / 3600, rel=1e-9)
    rate = usd_per_hour / 3600
    assert all(r.usage.cost_usd >= rate * own_seconds(r) * (1 - 1e-12) for r in priced)


def test_step_time_is_split_by_work_and_phases_add_up_to_wall():
    step = {"step_seconds": 2.0, "prefill_tokens": 8, "decode_tokens": 2}
    assert split_step(step) == pytest.approx({"prefill": 2.0 * 8 / 10, "decode": 2.0 * 2 / 10})
    run = RunRecord(wall_seconds=10.0, load_seconds=3.0, engine_seconds=5.0)
    phases = run_phases(run, [step, {"step_seconds": 1.0, "prefill_tokens": 0, "decode_tokens": 3}])
    assert phases["decode"] == pytest.approx(0.4 + 1.0)
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
    assert m.decode_token_s == 0.0 and m.step_s == pytest.approx(0.8, rel=0.05)


def test_fit_weighs_steps_by_relative_error_and_leaves_out_steps_slowed_by_load():
    def step(p, d, blocks, attended=0, slowed=1.0):
        return {
            "batch_tokens": p + d,
            "prefill_tokens": p,
            "decode_tokens": d,
            "prefill_context_tokens": attended,
            "kv_blocks_used": blocks,
            "step_seconds": slowed
            * (0.03 + 0.0012 * p + 0.0015 * d + 2e-5 * blocks * 16 * (d > 0) + 3e-6 * attended),
        }

    quiet = [step(0, d, (10 + 7 * j) * d + 20 * j) for d in (1, 2, 4, 8, 16, 32) for j in range(3)]
    quiet += [step(p, 0, p // 16, p * (p + 1) // 2) for p in (100, 400, 800)]
    quiet += [step(4 * p, 0, p // 4, 4 * p * (p + 1) // 2) for p in (100, 300)]
    # Another job took the cores for a few steps: 3 to 8 times as slow.
    loaded = [step(0, 16, 160, slowed=3.0), step(0, 4, 40, slowed=8.0), step(400, 0, 25, 80200, 5)]
    m = fit_step_model(quiet + loaded, load_s=0.0, rows=0)
    assert (m.step_s, m.token_s, m.decode_token_s, m.context_token_s, m.prefill_context_s) == (
        pytest.approx((0.03, 0.0012, 0.0015, 2e-5, 3e-6), rel=1e-6)
    )
    # The short decode steps set the per-sequence cost even beside long prefill steps.
    assert m.step_seconds(0, 32, 320 * 16) == pytest.approx(0.03 + 0.048 + 0.1024)


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
    # Every price names its source; one without a date says so and is warned about.
    assert all(a["source"] for a in out)
    assert all(a["date"] or a["source"] for a in out)


AMD_MILAN = "vendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 1\nmodel name\t: AMD EPYC\n"
INTEL_ICE_LAKE = "vendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 106\n"


def test_cpu_family_comes_from_the_vendor_family_and_model_numbers():
    assert cpu_family(AMD_MILAN) == "AMD Zen 3"
    assert cpu_family(INTEL_ICE_LAKE) == "Intel Ice Lake"
    assert cpu_family("vendor_id\t: AuthenticAMD\ncpu family\t: 99\nmodel\t: 1\n") == ""


def test_an_amd_cpu_is_never_priced_as_an_intel_instance():
    amd = device_rate(DeviceInfo("cpu", "AMD EPYC", 2, cpu_family(AMD_MILAN)))
    assert amd.price.unit == "vCPU-hour" and amd.units == 2
    assert "AMD" in amd.price.source and "Intel" not in amd.price.source
    assert amd.usd_per_hour == pytest.approx(2 * amd.price.usd_per_hour)
    unknown = device_rate(DeviceInfo("cpu", "AMD EPYC", 2, ""))
    assert "Intel" not in unknown.price.source and "c7i" not in unknown.price.source
    assert "per vCPU-hour x 2 vCPUs" in amd.label


def test_old_or_undated_prices_are_warned_about_and_overrides_replace_them(tmp_path):
    today = dt.date(2026, 12, 1)
    apis = [{"provider": "P", "model": "m", "date": "2026-09"}]
    assert price_warnings("2026-10", apis, today) == []
    (device, api) = price_warnings(
        "2026-03", [*apis, {"provider": "Q", "model": "n", "date": None}], today
    )
    assert "2026-03, 9 months old" in device and "1 of 2 hosted-API prices" in api
    assert "no dated source" in price_warnings(None, [], today)[0]
    cpu = DeviceInfo("cpu", "AMD EPYC", 2, "AMD Zen 3")
    rate = device_rate(cpu, CostConfig(gpu_hour_usd=0.05))
    assert (rate.usd_per_hour, rate.price.date) == (0.10, dt.date.today().isoformat())
    prices = tmp_path / "prices.json"
    prices.write_text(
        json.dumps(
            {
                "device": {"usd_per_hour": 0.03, "source": "our contract", "date": "2026-11"},
                "apis": [
                    {
                        "provider": "X",
                        "model": "x-1",
                        "usd_per_1m_input": 0.1,
                        "usd_per_1m_output": 0.4,
                        "usd_per_1m_cached_input": 0.01,
                        "source": "x.example/pricing",
                        "date": "2026-11-20",
                    }
                ],
            }
        )
    )
    cost = CostConfig(price_file=str(prices))
    rate = device_rate(cpu, cost)
    assert (rate.usd_per_hour, rate.price.source, rate.price.unit) == (
        0.06,
        "our contract",
        "vCPU-hour",
    )
    (x,) = api_equivalent(1_000_000, 1_000_000, prices=api_prices(cost))
    assert (x["model"], x["usd"], x["usd_per_1m_cached_input"]) == ("x-1", pytest.approx(0.5), 0.01)


def test_cost_model_and_reports_import_no_torch():
    code = (
        "import sys, jobrunner.telemetry.cost, jobrunner.telemetry.report, "
        "jobrunner.telemetry.prom, jobrunner.telemetry.throughput, jobrunner.telemetry.sampler; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
