"""Encoder batches on several single-threaded CPU workers at once (`embedding.cpu_workers`).

Batches are independent, so N workers on one batch each need no barrier between them, where N
threads inside each op of one batch wait for the slowest at the end of every op: on a shared
machine a descheduled thread stalls every op. torch's thread count is process-wide: it is 1
while the workers run and restored when they stop.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

import torch

T = TypeVar("T")
R = TypeVar("R")


def in_workers(run: Callable[[T], list[R]], items: Iterable[T], workers: int) -> Iterator[R]:
    """run(item) for every item on `workers` threads, the results yielded in item order; at most
    workers + 1 items are in flight (a queued one starts as soon as a worker is free)."""
    threads = torch.get_num_threads()
    pool = ThreadPoolExecutor(workers, initializer=torch.set_num_threads, initargs=(1,))
    inflight: deque[Future] = deque()
    try:
        for item in items:
            inflight.append(pool.submit(run, item))
            if len(inflight) > workers:
                yield from inflight.popleft().result()
        while inflight:
            yield from inflight.popleft().result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        torch.set_num_threads(threads)
