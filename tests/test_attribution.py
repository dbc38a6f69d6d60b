"""Per-row cost follows work on the real model: rows of equal work cost about the same,
whatever order they finish in, and the rows add up to the job's cost."""

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


def test_rows_of_equal_work_cost_within_a_small_factor(tmp_path):
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
    rows = pq.read_table(tmp_path / "out" / "results").to_pylist()
    assert len({r["prompt_tokens"] for r in rows}) == 1 and {
        r["completion_tokens"] for r in rows
    } == {8}
    costs = [r["cost_usd"] for r in rows]
    assert max(costs) / min(costs) < 2.0, costs
    assert summary.cost_usd == pytest.approx(sum(costs), rel=1e-12)
    run = json.loads((tmp_path / "out" / "manifest.json").read_text())["runs"][-1]
    # The last commit closes the pool: together the rows paid for the whole run's wall time.
    assert sum(costs) == pytest.approx(run["wall_seconds"] * run["usd_per_hour"] / 3600, rel=0.05)
