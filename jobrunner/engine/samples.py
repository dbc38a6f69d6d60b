"""n samples per row: a row with `sampling.n > 1` runs as n one-sample Requests, gathered back
into one Result with n choices. No torch.

Sample k keeps the row's id and has its own seed (`sample_seed`), so each sample reproduces
across runs and batch neighbours, and sample 0 is the row's single sample of n = 1. The samples
share the prompt's KV through the prefix cache (they are taken in one after another; the second
takes the full blocks the first computes in the same step, sched/step_blocks.py). A greedy row's samples are all the
same: it runs once and its choice is repeated n times (usage counts each, as the API does).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from dataclasses import replace

from jobrunner.types import Request, Result, Usage


def sample_seed(seed: int, index: int) -> int:
    if index == 0:
        return seed
    digest = hashlib.blake2b(f"{seed}\x00sample\x00{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def num_runs(req: Request) -> int:
    """How many samples are computed (a greedy row's n are one computation)."""
    return 1 if req.sampling.greedy else req.sampling.n


def split(requests: Iterable[Request]) -> Iterator[Request]:
    for req in requests:
        if req.sampling.n == 1:
            yield req
            continue
        for k in range(num_runs(req)):
            yield replace(req, sample_index=k, seq_seed=sample_seed(req.seq_seed, k))


def gather(results: Iterable[Result], n_of: dict[str, Request]) -> Iterator[Result]:
    """One Result per row once all its samples finished (`n_of`: the rows with n > 1, by id,
    filled by `Samples.split`)."""
    parts: dict[str, list[Result]] = {}
    for r in results:
        req = n_of.get(r.id)
        if req is None:
            yield r
            continue
        got = parts.setdefault(r.id, [])
        got.append(r)
        if len(got) == num_runs(req):
            del parts[r.id], n_of[r.id]
            yield merge(req, got)


def merge(req: Request, parts: list[Result]) -> Result:
    """The row's Result: every sample's choice, usage summed (the prompt once), the work of
    every computation summed (what telemetry.cost prices)."""
    failed = next((p for p in parts if not p.ok), None)
    first = min(parts, key=lambda p: p.choices[0].index if p.choices else 0)
    usage = sum_work([p.usage for p in parts])
    if failed is not None:
        usage.completion_tokens = sum(p.usage.completion_tokens for p in parts)
        return replace(failed, usage=usage, choices=[])
    choices = sorted((c for p in parts for c in p.choices), key=lambda c: c.index)
    if len(choices) < req.sampling.n:  # greedy: one computation, n identical choices
        choices = [replace(choices[0], index=k) for k in range(req.sampling.n)]
    usage.completion_tokens = sum(len(c.token_ids) for c in choices)
    return replace(first, choices=choices, usage=usage)


def sum_work(usages: list[Usage]) -> Usage:
    """The first usage's prompt counts and latencies, every usage's work and cost added."""
    out = replace(usages[0])
    for u in usages[1:]:
        out.prefill_tokens += u.prefill_tokens
        out.decode_tokens += u.decode_tokens
        out.device_seconds += u.device_seconds
        out.cost_usd += u.cost_usd
    return out


class Samples:
    """Wraps an engine's one-sample stream: `split` the requests in, `gather` the results out."""

    def __init__(self) -> None:
        self.rows: dict[str, Request] = {}

    def split(self, requests: Iterable[Request]) -> Iterator[Request]:
        for req in requests:
            if req.sampling.n > 1:
                self.rows[req.id] = req
            yield from split([req])

    def gather(self, results: Iterable[Result]) -> Iterator[Result]:
        return gather(results, self.rows)
