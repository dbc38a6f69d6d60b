"""Share measured engine time out to rows by the work each caused. No torch.

A row's work is its prefill plus its decode:
  - prefill: the prompt tokens actually computed (prefix-cache hits cost nothing);
  - decode: the steps the row spent in the running batch, one per completion token, each
    weighted by `decode_weight` (a decode step streams the weights for few tokens, so a decode
    token costs several prefill tokens of time).
Exact duplicates that shared one computation split its cost (`Result.shared_with`). The shares
of one commit interval add up to that interval's cost exactly, so the rows' cost_usd sum to the
job's total. The same rate prices what the prefix cache and deduplication saved.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from jobrunner.types import Result

DEFAULT_DECODE_WEIGHT = 4.0


def row_work(r: Result, decode_weight: float = DEFAULT_DECODE_WEIGHT) -> float:
    """The work of computing this row once, before any sharing."""
    u = r.usage
    return u.computed_prompt_tokens + decode_weight * u.completion_tokens


def work_units(r: Result, decode_weight: float = DEFAULT_DECODE_WEIGHT) -> float:
    """This row's share of the work: duplicates that shared one computation split it."""
    return row_work(r, decode_weight) / max(r.shared_with, 1)


@dataclass
class Savings:
    """Money the prefix cache and deduplication saved, priced at the rate actually paid."""

    cache_usd: float = 0.0
    dedup_usd: float = 0.0
    work_units: float = 0.0

    def add(self, other: Savings) -> None:
        self.cache_usd += other.cache_usd
        self.dedup_usd += other.dedup_usd
        self.work_units += other.work_units

    def to_json(self) -> dict[str, float]:
        return {
            "cache_saved_usd": self.cache_usd,
            "dedup_saved_usd": self.dedup_usd,
            "work_units": self.work_units,
        }


def share_cost(
    results: Sequence[Result], usd: float, decode_weight: float = DEFAULT_DECODE_WEIGHT
) -> Savings:
    """Set each result's usage.cost_usd so that together they add up to `usd`.

    Returns what the cache and dedup saved in this interval: a cached prompt token would have
    cost one prefill unit; a duplicate row would have cost its whole computation again.
    """
    if not results:
        return Savings()
    units = [work_units(r, decode_weight) for r in results]
    total = sum(units)
    for r, w in zip(results, units, strict=True):
        r.usage.cost_usd = usd * (w / total if total else 1 / len(results))
    if not total:
        return Savings()
    rate = usd / total  # USD per work unit in this interval
    saved = Savings(work_units=total)
    for r in results:
        k = max(r.shared_with, 1)
        saved.cache_usd += rate * r.usage.cached_tokens / k
        saved.dedup_usd += rate * row_work(r, decode_weight) * (k - 1) / k
    return saved


def per_million(usd: float, tokens: int) -> float | None:
    return usd / tokens * 1e6 if tokens else None
