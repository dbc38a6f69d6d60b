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

from collections import defaultdict
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


def time_breakdown(runs: list[RunRecord], steps: list[dict[str, Any]]) -> dict[str, Any]:
    """{"seconds": {phase: s}, "usd": {phase: usd}} over every run of the job."""
    by_run: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for s in steps:
        by_run[int(s.get("run") or 0)].append(s)
    seconds = dict.fromkeys(PHASES, 0.0)
    usd = dict.fromkeys(PHASES, 0.0)
    for i, run in enumerate(runs):
        phases = run_phases(run, by_run.get(i, []))
        rate = (run.usd_per_hour or 0.0) / 3600
        for k, v in phases.items():
            seconds[k] += v
            usd[k] += v * rate
    return {"seconds": seconds, "usd": usd}


def run_phases(run: RunRecord, steps: list[dict[str, Any]]) -> dict[str, float]:
    out = dict.fromkeys(PHASES, 0.0)
    for s in steps:
        for k, v in split_step(s).items():
            out[k] += v
    stepped = out["prefill"] + out["decode"] + out["forward"]
    engine = run.engine_seconds
    if not steps:  # no step log: the engine's own forward figure stands in
        out["forward"] = stepped = run.forward_seconds
    out["load"] = run.load_seconds
    out["engine"] = max(engine - stepped, 0.0)
    out["other"] = max(run.wall_seconds - out["load"] - max(engine, stepped), 0.0)
    return out
