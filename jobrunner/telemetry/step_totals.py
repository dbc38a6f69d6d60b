"""What the report needs of telemetry/steps.parquet, in one vectorized pass over its batches:
per run, the step seconds split into prefill, decode and unsplit forward time (as
breakdown.split_step splits one step), and the peaks of KV blocks and running sequences. A job
of tens of millions of steps is summed without a Python object per step."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from jobrunner.telemetry.timeline import STEPS_FILE, column_floats, timeline_batches

COLUMNS = [
    "run",
    "step_seconds",
    "prefill_tokens",
    "decode_tokens",
    "kv_blocks_used",
    "num_running",
]


@dataclass
class StepTotals:
    phases: dict[int, dict[str, float]] = field(default_factory=dict)  # run -> phase -> s
    kv_blocks_peak: float | None = None
    running_peak: float | None = None


def step_totals(run_path: str | Path) -> StepTotals:
    out = StepTotals()
    for batch in timeline_batches(run_path, STEPS_FILE, COLUMNS):
        col = {n: column_floats(batch, n) for n in COLUMNS}
        secs = np.nan_to_num(col["step_seconds"])
        p, d = col["prefill_tokens"], col["decode_tokens"]
        total = p + d
        split = ~np.isnan(total) & (total > 0)
        share = np.divide(p, total, out=np.zeros_like(secs), where=split)
        parts = {
            "prefill": np.where(split, secs * share, 0.0),
            "decode": np.where(split, secs * (1 - share), 0.0),
            "forward": np.where(split, 0.0, secs),
        }
        runs = np.nan_to_num(col["run"]).astype(np.int64)
        for run in np.unique(runs):
            mask = runs == run
            acc = out.phases.setdefault(int(run), dict.fromkeys(parts, 0.0))
            for k, v in parts.items():
                acc[k] += float(v[mask].sum())
        out.kv_blocks_peak = _max(out.kv_blocks_peak, col["kv_blocks_used"])
        out.running_peak = _max(out.running_peak, np.nan_to_num(col["num_running"]))
    return out


def _max(best: float | None, values: np.ndarray) -> float | None:
    values = values[~np.isnan(values)]
    if not len(values):
        return best
    peak = float(values.max())
    return peak if best is None else max(best, peak)
