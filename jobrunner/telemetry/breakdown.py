"""Where the time went, and so where the money went: one figure per phase, summed over runs.

Phases of a run's wall time:
  load      reading the weights and building the engine
  prefill   forward time spent on prompt tokens  } each step's time is split between the two
  decode    forward time spent generating tokens } by tokens computed, as rows are billed
  forward   step time not split (engines that log no prefill/decode counts)
  engine    engine time outside the steps (scheduling, waiting for input, detokenizing)
  other     the rest: reading input, committing shards, shutting down
Each phase is priced at its run's device-hour rate.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from jobrunner.telemetry.record import RunRecord

PHASES = ("load", "prefill", "decode", "forward", "engine", "other")


def split_step(step: dict[str, Any]) -> dict[str, float]:
    """One step's seconds as {prefill, decode} (or {forward} when the step has no counts)."""
    secs = step.get("step_seconds") or 0.0
    p, d = step.get("prefill_tokens"), step.get("decode_tokens")
    if p is None or d is None or p + d == 0:
        return {"forward": secs}
    return {"prefill": secs * p / (p + d), "decode": secs * d / (p + d)}


def time_breakdown(runs: list[RunRecord], stepped: dict[int, dict[str, float]]) -> dict[str, Any]:
    """{"seconds": {phase: s}, "usd": {phase: usd}} over every run of the job; `stepped`: per
    run index, its steps' seconds as {prefill, decode, forward} (step_totals), absent for a
    run that logged no steps."""
    seconds = dict.fromkeys(PHASES, 0.0)
    usd = dict.fromkeys(PHASES, 0.0)
    for i, run in enumerate(runs):
        phases = phases_of(run, stepped.get(i))
        rate = (run.usd_per_hour or 0.0) / 3600
        for k, v in phases.items():
            seconds[k] += v
            usd[k] += v * rate
    return {"seconds": seconds, "usd": usd}


def run_phases(run: RunRecord, steps: Iterable[dict[str, Any]]) -> dict[str, float]:
    """One run's phases from its step records."""
    sums: dict[str, float] | None = None
    for s in steps:
        sums = sums or {"prefill": 0.0, "decode": 0.0, "forward": 0.0}
        for k, v in split_step(s).items():
            sums[k] += v
    return phases_of(run, sums)


def phases_of(run: RunRecord, stepped: dict[str, float] | None) -> dict[str, float]:
    out = dict.fromkeys(PHASES, 0.0)
    out.update(stepped or {})
    total = out["prefill"] + out["decode"] + out["forward"]
    engine = run.engine_seconds
    if stepped is None:  # no step log: the engine's own forward figure stands in
        out["forward"] = total = run.forward_seconds
    out["load"] = run.load_seconds
    out["engine"] = max(engine - total, 0.0)
    out["other"] = max(run.wall_seconds - out["load"] - max(engine, total), 0.0)
    return out
