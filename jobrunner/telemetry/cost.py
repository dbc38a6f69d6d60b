"""Share measured engine time out to rows by the work each caused. No torch.

A row's work is its computed prompt tokens (prefix-cache hits cost nothing) plus its decode
tokens weighted by `decode_weight` (a decode token costs more than a prefill token); exact
duplicates that shared one computation split its cost. The shares of one commit interval add up
to that interval's engine time exactly, so the rows' cost_usd sum to the job's total.
"""

from __future__ import annotations

from collections.abc import Sequence

from jobrunner.types import Result

DEFAULT_DECODE_WEIGHT = 4.0


def work_units(r: Result, decode_weight: float = DEFAULT_DECODE_WEIGHT) -> float:
    u = r.usage
    return (u.computed_prompt_tokens + decode_weight * u.completion_tokens) / max(r.shared_with, 1)


def share_cost(results: Sequence[Result], usd: float, decode_weight: float = DEFAULT_DECODE_WEIGHT) -> None:
    """Set each result's usage.cost_usd so that together they add up to `usd`."""
    if not results:
        return
    units = [work_units(r, decode_weight) for r in results]
    total = sum(units)
    for r, w in zip(results, units):
        r.usage.cost_usd = usd * (w / total if total else 1 / len(results))


def per_million(usd: float, tokens: int) -> float | None:
    return usd / tokens * 1e6 if tokens else None
