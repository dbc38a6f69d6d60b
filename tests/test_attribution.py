"""Per-row cost follows work on the real model: each engine step's measured time is shared by
the rows in it by the tokens each computed, the time outside steps by work, and the rows add up
to the job's cost.

The machine's speed may change from one step to the next (other jobs share the cores), so the
checks are written against the measured step times, never against a quiet machine: rows that
ran in the same steps cost the same, a row's own time is its share of those steps, and the time
outside steps (the model load above all) is spread evenly, not paid by the first to finish.
"""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from jobrunner.config import load_job
from jobrunner.pipeline import run_job

pytestmark = pytest.mark.slow

JOB = """name: attribution
model: {{source: smollm2-135m-instruct, dtype: float32, max_model_len: 512}}
input: {{path: {input}, id_column: id, prompt: {{column: prompt}}}}
generation: {{max_new_tokens: 8, temperature: 0.0, ignore_eos: true}}
output: {{path: {out}, format: parquet, shard_rows: 1}}
engine: {{kind: paged, kv_cache_bytes: 50000000, max_num_seqs: 2, prefix_caching: false}}
cost: {{gpu_hour_usd: 2.0}}
"""


def _pairs_of_steps(steps: list[dict]) -> list[float]:
    """The measured seconds of each pair's steps: two rows at a time, each pair starting with
    the step that computes both prompts."""
    starts = [i for i, s in enumerate(steps) if s["prefill_tokens"]]
    assert len(starts) == 4 and all(steps[i]["prefill_tokens"] == 2 * 36 for i in starts)
    return [
        sum(s["step_seconds"] for s in steps[a:b])
        for a, b in zip(starts, [*starts[1:], len(steps)], strict=True)
    ]


def test_rows_of_equal_work_cost_what_their_steps_measured(tmp_path):
    # Eight prompts of the same length, two at a time, one shard per row: the first rows to
    # finish used to pay for the model load and the prefill of every row in flight.
    (tmp_path / "in.jsonl").write_text(
        "".join(
            json.dumps({"id": f"r{i}", "prompt": f"Say the number {i}."}) + "\n" for i in range(8)
        )
    )
    job = tmp_path / "job.yaml"
    job.write_text(JOB.format(input=tmp_path / "in.jsonl", out=tmp_path / "out"))
    summary = run_job(load_job(job))
    telemetry = tmp_path / "out" / "telemetry"
    rows = pq.read_table(telemetry / "rows.parquet").to_pylist()  # in finishing order
    assert [(r["prefill_tokens"], r["decode_tokens"]) for r in rows] == [(36, 7)] * 8
    pairs = _pairs_of_steps(pq.read_table(telemetry / "steps.parquet").to_pylist())
    run = json.loads((tmp_path / "out" / "manifest.json").read_text())["runs"][-1]
    rate = run["usd_per_hour"] / 3600  # $ per second (2 vCPUs at $2.0 each)
    # Within a pair: the same tokens in the same steps, so the same own time, each half of the
    # pair's measured steps (rounded to 10 us in the log), and about the same cost.
    for k, measured in enumerate(pairs):
        a, b = rows[2 * k], rows[2 * k + 1]
        assert a["device_seconds"] == pytest.approx(b["device_seconds"], rel=1e-9)
        assert a["device_seconds"] == pytest.approx(measured / 2, rel=1e-3, abs=1e-4)
        assert a["cost_usd"] == pytest.approx(b["cost_usd"], rel=0.25)
    # Across pairs the steps' speed differs with the machine's load; what the rows paid beyond
    # their own steps (load, start-up, idle) is spread by work: about the same for each row,
    # and no row pays for the model load alone.
    outside = [r["cost_usd"] / rate - r["device_seconds"] for r in rows]
    assert min(outside) > 0 and max(outside) / min(outside) < 2.0, outside
    costs = [r["cost_usd"] for r in rows]
    assert summary.cost_usd == pytest.approx(sum(costs), rel=1e-12)
    results = pq.read_table(tmp_path / "out" / "results").to_pylist()
    assert sorted(r["cost_usd"] for r in results) == pytest.approx(sorted(costs), rel=1e-12)
    # The last commit closes the pool: together the rows paid for the whole run's wall time.
    assert sum(costs) == pytest.approx(run["wall_seconds"] * rate, rel=0.05)
