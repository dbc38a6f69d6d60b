"""`jobrunner estimate`: counts without weights, bounds completions, calibrates on request."""

from __future__ import annotations

import json
import random
from array import array

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from jobrunner.cli import app
from jobrunner.config import JobConfig
from jobrunner.estimate import SeenBlocks, _cached
from jobrunner.sched.block_manager import CHILDREN_KEPT, common_length

PROMPTS = [
    "What is a Python list?",
    "What is a Python list?",
    "Name three sorting algorithms.",
    "",
    "Why use a generator?",
]
JOB = """name: estimate-test
model: {{source: smollm2-135m-instruct, dtype: float32, max_model_len: 512}}
input: {{path: {input}, id_column: id, prompt: {{column: prompt}}, max_error_rate: 0.5}}
generation: {{max_new_tokens: 6, temperature: 0.0}}
output: {{path: {out}}}
engine: {{kind: paged, kv_cache_bytes: 20000000}}
"""


@pytest.fixture(autouse=True)
def fresh_profiles(monkeypatch, tmp_path):
    """Each test starts on a device with no profile: the session's profile folder holds what
    earlier tests' runs recorded (a matching one would replace the bounds checked here)."""
    monkeypatch.setenv("JOBRUNNER_PROFILE_DIR", str(tmp_path / "fresh-profiles"))


@pytest.fixture
def job(tmp_path):
    pq.write_table(
        pa.Table.from_pylist([{"id": f"q{i}", "prompt": p} for i, p in enumerate(PROMPTS)]),
        tmp_path / "in.parquet",
    )
    path = tmp_path / "job.yaml"
    path.write_text(JOB.format(input=tmp_path / "in.parquet", out=tmp_path / "out"))
    return path


def _forbid_weights(monkeypatch):
    import jobrunner.engine.loader as loader

    monkeypatch.setattr(
        loader, "load_model", lambda *a, **k: pytest.fail("estimate loaded weights")
    )


def test_estimate_counts_rows_and_tokens_without_weights(job, monkeypatch, tmp_path):
    _forbid_weights(monkeypatch)
    monkeypatch.setenv("JOBRUNNER_PROFILE_DIR", str(tmp_path / "no-profiles-yet"))
    cli = CliRunner()
    res = cli.invoke(app, ["estimate", str(job)])
    assert res.exit_code == 0, res.output
    est = json.loads((job.parent / "out" / "estimate.json").read_text())
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert summary["estimate"] == str(job.parent / "out" / "estimate.json")
    val = cli.invoke(app, ["validate", str(job)])  # an independent count of the same prompts
    counted = json.loads(val.stdout.strip().splitlines()[-1])
    assert (est["rows"], est["valid_rows"], est["invalid_rows"], est["deduplicated"]) == (
        5,
        4,
        1,
        1,
    )
    assert est["prompt_tokens"] == counted["prompt_tokens"]
    assert est["completion_tokens"] == est["completion_tokens_max"] == 4 * 6
    assert est["completion_source"].startswith("upper bound")
    assert est["throughput"]["source"].startswith("roofline default")
    assert est["wall_seconds"] > 0 and est["cost_usd"] == pytest.approx(
        est["wall_seconds"] * est["usd_per_hour"] / 3600
    )
    assert {a["model"] for a in est["api_equivalent"]} >= {"gpt-4o-mini", "claude-3.5-haiku"}


def test_prefix_cache_simulation_matches_block_manager_rules():
    cfg = JobConfig.model_validate({"engine": {"block_size": 4}})
    seen = SeenBlocks()
    assert _cached(list(range(1, 11)), cfg, seen) == 0  # a cold cache
    assert _cached([1, 2, 3, 4, 5, 6, 7, 8, 99, 100], cfg, seen) == 8  # two shared full blocks
    # the last token is always computed; the first row to stop after [1, 2, 3, 4] finds no
    # block kept after it (a run would serve 3 tokens of [5, 6, 7, 8]), the next one does
    assert _cached([1, 2, 3, 4, 5, 6, 7, 8], cfg, seen) == 4
    assert _cached([1, 2, 3, 4, 5, 6, 0, 0, 0], cfg, seen) == 6  # a head ending mid-block
    assert _cached([9, 2, 3, 4, 5, 6, 7, 8], cfg, seen) == 0  # chained: a new head breaks it
    off = JobConfig.model_validate({"engine": {"block_size": 4, "prefix_caching": False}})
    assert _cached([1, 2, 3, 4, 5], off, SeenBlocks()) == 0


def served_by_block_manager(prompts: list[list[int]], bs: int) -> list[int]:
    """Prompt tokens the block manager serves each row, rows arriving one at a time into a
    cache that never evicts."""
    from jobrunner.sched import BlockManager, Sequence
    from jobrunner.types import Request, SamplingParams

    bm, out = BlockManager(num_blocks=4096, block_size=bs), []
    for i, ids in enumerate(prompts):
        seq = Sequence(Request(str(i), ids, SamplingParams()), 8, frozenset())
        hits = bm.cached_prefix(seq)
        partial = bm.cached_partial(seq, hits)
        out.append(len(hits) * bs + (partial[1] if partial else 0))
        bm.take_prefix(seq, hits, out[-1] - len(hits) * bs)
        assert bm.append_slots(seq, len(ids) - out[-1])
        seq.num_computed_tokens = len(ids)
        bm.cache_full_blocks(seq)
    return out


def test_the_estimated_prefix_hits_follow_what_the_block_manager_serves():
    cfg = JobConfig.model_validate({"engine": {"block_size": 4}})
    rng = random.Random(7)
    heads = [[rng.randrange(5) for _ in range(rng.randrange(4, 14))] for _ in range(4)]
    prompts = [
        rng.choice(heads) + [rng.randrange(5) for _ in range(rng.randrange(1, 12))]
        for _ in range(100)
    ]
    seen = SeenBlocks()
    estimated = [_cached(ids, cfg, seen) for ids in prompts]
    served = served_by_block_manager(prompts, 4)  # rows one at a time, prompts only
    assert all(e <= s for e, s in zip(estimated, served, strict=True))
    assert sum(estimated) >= 0.9 * sum(served), (sum(estimated), sum(served))
    # one template whose head ends mid-block: every row but the second is served alike (the
    # second's partial head comes from the first row's block, which the estimate does not keep)
    template = [list(range(1, 11)) + [100 + i, 200 + i, 7] for i in range(20)]
    seen = SeenBlocks()
    estimated = [_cached(ids, cfg, seen) for ids in template]
    served = served_by_block_manager(template, 4)
    assert served == [0] + [10] * 19  # two full blocks and [9, 10] of the third
    assert estimated == [0, 8] + [10] * 18


def test_completion_bound_respects_the_context(job, monkeypatch):
    _forbid_weights(monkeypatch)
    res = CliRunner().invoke(app, ["estimate", str(job), "--set", "generation.max_new_tokens=5000"])
    assert res.exit_code == 0, res.output
    est = json.loads((job.parent / "out" / "estimate.json").read_text())
    assert est["completion_tokens"] == 4 * 512 - est["prompt_tokens"]


@pytest.mark.slow
def test_calibration_stores_a_device_profile_that_later_estimates_use(job, monkeypatch, tmp_path):
    from jobrunner.engine import start

    monkeypatch.setenv("JOBRUNNER_PROFILE_DIR", str(tmp_path / "profiles"))
    # the imports a run's load pays, which this process has done already, are measured apart
    monkeypatch.setattr(start, "fresh_import_seconds", lambda: 1000.0)
    res = CliRunner().invoke(app, ["estimate", str(job), "--calibrate", "2"])
    assert res.exit_code == 0, res.output
    est = json.loads((job.parent / "out" / "estimate.json").read_text())
    assert est["completion_source"].startswith("measured:")
    assert "over 2 sampled rows" in est["completion_source"]
    assert est["throughput"]["source"].startswith("this device's profile:")
    assert 0 < est["completion_tokens"] <= est["completion_tokens_max"]
    assert est["throughput"]["load_s"] > 1000.0
    (profile,) = (tmp_path / "profiles").glob("*.json")
    # Uncalibrated, on the same device: the profile's fit and completion share, no weights.
    _forbid_weights(monkeypatch)
    res = CliRunner().invoke(app, ["estimate", str(job)])
    assert res.exit_code == 0, res.output
    again = json.loads((job.parent / "out" / "estimate.json").read_text())
    assert again["throughput"] == est["throughput"]
    assert again["completion_source"].startswith("this device's profile:")
    assert again["profile"] == json.loads(profile.read_text())["key"]


@pytest.mark.parametrize(
    ("model", "want"),
    [
        ({"dtype": "float32"}, 46080),  # 30 layers x 3 KV heads x 64 x (K, V) x 4 bytes
        ({"dtype": "float32", "quantization": "int8"}, 46080),  # int8 weights: the cache stays
        ({"dtype": "float32", "kv_cache_dtype": "float16"}, 23040),
        ({"dtype": "bfloat16", "kv_cache_dtype": "int8"}, 11880),  # 64 codes + a 2-byte scale
    ],
)
def test_kv_bytes_per_token_follow_the_cache_format_not_the_weights(model, want):
    from jobrunner.estimate import kv_bytes_per_token

    cfg = JobConfig()
    for k, v in model.items():
        setattr(cfg.model, k, v)
    assert kv_bytes_per_token(cfg) == want


def _estimate(job, *sets: str) -> dict:
    args = ["estimate", str(job)]
    for s in sets:
        args += ["--set", s]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    return json.loads((job.parent / "out" / "estimate.json").read_text())


def test_n_samples_multiply_the_decode_work_and_the_cost(job, monkeypatch):
    _forbid_weights(monkeypatch)
    one = _estimate(job, "generation.temperature=0.8")
    three = _estimate(job, "generation.temperature=0.8", "generation.n=3")
    # Sampled: no dedup, each of the 4 valid rows runs 3 times and returns 3 x 6 tokens.
    assert (one["deduplicated"], three["deduplicated"]) == (0, 0)
    assert one["completion_tokens"] == one["completion_tokens_max"] == 4 * 6
    assert three["completion_tokens"] == three["completion_tokens_max"] == 3 * 4 * 6
    # samples 1 and 2 of a row find its prompt's full blocks in the prefix cache
    assert one["computed_prompt_tokens"] < three["computed_prompt_tokens"]
    assert three["computed_prompt_tokens"] < 3 * one["computed_prompt_tokens"]
    assert (one["decode_tokens"], three["decode_tokens"]) == (4 * 6, 3 * 4 * 6)
    assert three["forward_seconds"] > one["forward_seconds"]
    assert three["cost_usd"] > one["cost_usd"]
    # Greedy: the n choices are one computation, but each is returned (and counted).
    greedy = _estimate(job, "generation.n=3")
    plain = _estimate(job)
    assert greedy["completion_tokens"] == 3 * plain["completion_tokens"] == 3 * 4 * 6
    assert greedy["computed_prompt_tokens"] == plain["computed_prompt_tokens"]
    assert greedy["decode_tokens"] == plain["decode_tokens"] == 3 * 6  # the duplicate runs once
    assert greedy["forward_seconds"] == pytest.approx(plain["forward_seconds"])


def test_a_choice_grammar_bounds_completions_by_its_longest_label(job, monkeypatch):
    _forbid_weights(monkeypatch)
    est = _estimate(job, 'generation.choice=["yes", "no"]')
    assert est["completion_tokens"] == est["completion_tokens_max"] == 4 * 2  # a label and EOS


@pytest.mark.parametrize(("auto_picks", "uses_profile"), [("float32", True), ("bfloat16", False)])
def test_a_profile_recorded_in_one_dtype_is_not_used_for_another(
    job, monkeypatch, auto_picks, uses_profile
):
    import torch

    import jobrunner.estimate as estimate
    from jobrunner.config import load_job
    from jobrunner.telemetry.device import detect_device
    from jobrunner.telemetry.profile import profile_key, record

    _forbid_weights(monkeypatch)
    step = {"batch_tokens": 4, "prefill_tokens": 4, "decode_tokens": 0, "step_seconds": 0.5}
    key = profile_key(load_job(job), detect_device(), "float32")  # a float32 run recorded it
    record(key, steps=[step, {**step, "batch_tokens": 8, "prefill_tokens": 8}])
    monkeypatch.setattr(estimate, "pick_dtype", lambda *a: (getattr(torch, auto_picks), "test"))
    est = _estimate(job, "model.dtype=auto")
    assert (est["profile"] == key) is uses_profile
    source = est["throughput"]["source"]
    assert source.startswith("this device's profile" if uses_profile else "roofline default")


@pytest.mark.slow
def test_a_run_records_the_profile_that_the_next_estimate_on_this_device_uses(job, monkeypatch):
    # dtype auto: the run keys its steps by the dtype it loaded, the estimate by the one the
    # probe's cached choice names; they must be the same profile
    cli = CliRunner()
    res = cli.invoke(app, ["run", str(job), "--set", "model.dtype=auto"])
    assert res.exit_code == 0, res.output
    _forbid_weights(monkeypatch)
    est = _estimate(job, "model.dtype=auto")
    assert est["profile"] is not None
    assert est["throughput"]["source"].startswith("this device's profile")


def test_a_fresh_interpreter_times_the_imports_a_run_counts_in_its_load():
    """`estimate --calibrate` has torch imported before it loads the model; a run imports it
    inside its load (engine/start.py LOAD_PARTS), so the calibration times it in a child."""
    from jobrunner.engine.start import fresh_import_seconds

    seconds = fresh_import_seconds()
    assert seconds is not None and seconds > 0


def test_the_child_sharing_most_tokens_is_found_among_many():
    """SeenBlocks looks at two neighbours in sorted order, not every child: the answer must be
    the brute-force best, token ids of several bytes included."""
    rng = random.Random(3)
    for _ in range(200):
        seen = SeenBlocks()
        blocks = [[rng.choice([1, 2, 256, 513, 70000]) for _ in range(8)] for _ in range(20)]
        for b in blocks:
            seen._add(array("I", b).tobytes(), range(0, 1), 8, None)
        want = [rng.choice([1, 2, 256, 513, 70000]) for _ in range(7)]
        kept = blocks[-CHILDREN_KEPT:]
        best = max(common_length(tuple(b), want) for b in kept)
        assert seen._partial(None, array("I", want).tobytes()) == best


def test_a_report_compares_only_an_estimate_made_for_the_run_s_settings(job):
    """estimate, then the job file edited (more new tokens), then run: the report does not set
    the old estimate against the new run, and says which settings differ."""
    cli = CliRunner()
    assert cli.invoke(app, ["estimate", str(job)]).exit_code == 0
    job.write_text(job.read_text().replace("max_new_tokens: 6", "max_new_tokens: 3"))
    res = cli.invoke(app, ["run", str(job)])
    assert res.exit_code == 0, res.output
    out = job.parent / "out"
    report = json.loads((out / "report.json").read_text())
    assert report["estimate"]["other_settings"] == ["generation"]
    assert "figures" not in report["estimate"]
    assert "made for other settings (generation)" in (out / "report.md").read_text()
