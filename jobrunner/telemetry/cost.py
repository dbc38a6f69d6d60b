"""Price rows by the work each caused, so that they add up to the job's cost. No torch.

A row pays for two things, at the device's price per second:
  - its own step time, `Usage.device_seconds`: the engines share each measured step's time by
    the tokens each row computed in it (prompt tokens not served by the prefix cache, decode
    and draft tokens), so a row pays for the steps it was in, whenever it finishes;
  - a share of the time outside the steps (model load, start-up, idle waits, commits), by its
    `Usage.work_tokens`. That time is a pool that grows as the run goes. Each commit charges
    the pool at the rate that would spread it evenly over the work still to come (the rows
    still expected times the mean work per row so far), and the last commit charges what is
    left, so the first rows to finish do not pay for the load alone.
Exact duplicates that shared one computation carry the leader's work and split it
(`Result.shared_with`). The rows' cost_usd add up to `CostLedger.cost_usd`, which at the last
commit is the wall time since the clock started at the device price.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

from jobrunner.types import Result


def work_units(r: Result) -> float:
    """This row's share of the work: duplicates that shared one computation split it."""
    return r.usage.work_tokens / max(r.shared_with, 1)


def own_seconds(r: Result) -> float:
    """This row's share of the measured step time."""
    return r.usage.device_seconds / max(r.shared_with, 1)


@dataclass
class Savings:
    """Money the prefix cache and deduplication saved, priced at the rate actually paid."""

    cache_usd: float = 0.0
    dedup_usd: float = 0.0
    work_units: float = 0.0
    dedup_prompt_tokens: float = 0.0  # duplicate rows' prompt tokens, which no step computed

    def add(self, other: Savings) -> None:
        self.cache_usd += other.cache_usd
        self.dedup_usd += other.dedup_usd
        self.work_units += other.work_units
        self.dedup_prompt_tokens += other.dedup_prompt_tokens

    def to_json(self) -> dict[str, float]:
        return {
            "cache_saved_usd": self.cache_usd,
            "dedup_saved_usd": self.dedup_usd,
            "work_units": self.work_units,
            "dedup_prompt_tokens": self.dedup_prompt_tokens,
        }


class CostLedger:
    """Sets each committed row's usage.cost_usd (see the module docstring for the rule)."""

    def __init__(self, usd_per_hour: float, expected_rows: int = 0, start: float | None = None):
        self.usd_per_second = usd_per_hour / 3600.0
        self.expected_rows = expected_rows  # rows this run will commit (0: unknown)
        self.start = time.monotonic() if start is None else start
        self.rows = 0
        self.work = 0.0  # work tokens of the rows priced so far
        self.row_seconds = 0.0  # their own step seconds
        self.overhead_seconds = 0.0  # time outside steps charged so far
        self.cost_usd = 0.0  # the sum of the priced rows' cost_usd
        self.computations = 0.0  # rows computed (k duplicates count once)
        self.completion_tokens = 0.0  # ... and the tokens they generated

    def price(
        self,
        results: Sequence[Result],
        measured_seconds: float,
        now: float | None = None,
        final: bool = False,
    ) -> Savings:
        """Price `results`. `measured_seconds`: the engine's step time so far, rows still in
        flight included (their steps are theirs to pay, later); `final`: no rows follow."""
        if not results:
            return Savings()
        now = time.monotonic() if now is None else now
        own = [own_seconds(r) for r in results]
        work = [work_units(r) for r in results]
        if not sum(work):  # rows that computed nothing (rejected) share the pool equally
            work = [1.0] * len(results)
        charge = self._overhead_charge(
            sum(own), sum(work), len(results), measured_seconds, now, final
        )
        total_work = sum(work)
        costs = [
            self.usd_per_second * (s + charge * w / total_work)
            for s, w in zip(own, work, strict=True)
        ]
        for r, usd in zip(results, costs, strict=True):
            r.usage.cost_usd = usd
        self.rows += len(results)
        self.work += total_work
        self.row_seconds += sum(own)
        self.overhead_seconds += charge
        self.computations += sum(1 / max(r.shared_with, 1) for r in results)
        self.completion_tokens += sum(
            r.usage.completion_tokens / max(r.shared_with, 1) for r in results
        )
        self.cost_usd = math.fsum([self.cost_usd, *costs])
        return _savings(results, costs, total_work)

    def _overhead_charge(
        self, own: float, work: float, rows: int, measured: float, now: float, final: bool = False
    ) -> float:
        in_steps = self.row_seconds + own
        if final:  # nothing in flight: what the rows' own steps do not cover is the pool's
            return max(now - self.start - in_steps - self.overhead_seconds, 0.0)
        pool = max(now - self.start - max(in_steps, measured) - self.overhead_seconds, 0.0)
        ahead = max(self.expected_rows - self.rows - rows, 0)
        mean = (self.work + work) / (self.rows + rows)
        return pool * work / (work + ahead * mean)


def _savings(results: Sequence[Result], costs: list[float], work: float) -> Savings:
    """A cached prompt token would have cost what a computed one did in this commit; a
    duplicate row would have cost its whole computation again."""
    rate = math.fsum(costs) / work if work else 0.0
    saved = Savings(work_units=work)
    for r, usd in zip(results, costs, strict=True):
        k = max(r.shared_with, 1)
        saved.cache_usd += rate * r.usage.cached_tokens / k
        saved.dedup_usd += usd * (k - 1)
        # each of a group's k rows carries the leader's usage: k (k - 1) / k = the followers'
        saved.dedup_prompt_tokens += r.usage.computed_prompt_tokens * (k - 1) / k
    return saved


def per_million(usd: float, tokens: int) -> float | None:
    return usd / tokens * 1e6 if tokens else None
