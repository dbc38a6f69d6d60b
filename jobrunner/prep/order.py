"""Work ordering over a bounded window of the request stream.

Within each window of `window` requests: rows are sorted by priority, then by their prompt
tokens, which puts prompts that share a head next to each other (the prefix cache then hits
while the head is still cached). The resulting runs of shared heads are emitted alternately
from the long end and the short end, so long prompts are spread among short ones and the
engine's token budget stays evenly used. Only one window is held in memory.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import islice

from jobrunner.types import Request

HEAD_TOKENS = 32  # prompts agreeing on this many leading tokens form one run


def order_requests(requests: Iterable[Request], window: int) -> Iterator[Request]:
    it = iter(requests)
    while chunk := list(islice(it, window)):
        yield from order_window(chunk)


def order_window(chunk: list[Request]) -> list[Request]:
    by_priority: dict[int, list[Request]] = {}
    for r in chunk:
        by_priority.setdefault(r.priority, []).append(r)
    out: list[Request] = []
    for priority in sorted(by_priority, reverse=True):
        out += _interleave(_runs(sorted(by_priority[priority], key=lambda r: r.prompt_token_ids)))
    return out


def _runs(rows: list[Request]) -> list[list[Request]]:
    """Consecutive rows (already sorted by tokens) that share their first HEAD_TOKENS tokens."""
    runs: list[list[Request]] = []
    for r in rows:
        if runs and runs[-1][0].prompt_token_ids[:HEAD_TOKENS] == r.prompt_token_ids[:HEAD_TOKENS]:
            runs[-1].append(r)
        else:
            runs.append([r])
    return runs


def _interleave(runs: list[list[Request]]) -> list[Request]:
    """Runs by mean prompt length, taken longest, shortest, next longest, ..."""
    runs.sort(key=lambda run: sum(r.num_prompt_tokens for r in run) / len(run))
    out: list[Request] = []
    lo, hi = 0, len(runs) - 1
    while lo <= hi:
        out += runs[hi]
        if lo != hi:
            out += runs[lo]
        lo, hi = lo + 1, hi - 1
    return out
