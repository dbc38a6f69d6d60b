"""Encoder batches on several single-threaded CPU workers at once (`embedding.cpu_workers`).

Batches are independent, so N workers on one batch each need no barrier between them, where N
threads inside each op of one batch wait for the slowest at the end of every op: on a shared
machine a descheduled thread stalls every op. torch's thread count is process-wide: it is 1
while the workers run and restored when they stop.

Batches that overlap share the wall time they ran in (`SharedClock`): the seconds a batch is
billed and the engine's forward time are never more than the wall clock, whatever the number
of workers.
"""

from __future__ import annotations

import threading
import time
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


class SharedClock:
    """Wall time split between pieces of work that run at once: while k of them run, each
    accrues 1/k of the time that passes, so the seconds `stop` returns sum to the time during
    which any of them ran. Thread-safe."""

    def __init__(self, now: Callable[[], float] = time.perf_counter) -> None:
        self._now = now
        self._lock = threading.Lock()
        self._running: dict[int, float] = {}  # token -> seconds accrued so far
        self._last = 0.0
        self._tokens = 0

    def start(self) -> int:
        with self._lock:
            self._advance()
            self._tokens += 1
            self._running[self._tokens] = 0.0
            return self._tokens

    def stop(self, token: int) -> float:
        """The share of wall time the work started as `token` ran in."""
        with self._lock:
            self._advance()
            return self._running.pop(token)

    def _advance(self) -> None:
        now = self._now()
        if self._running:
            share = (now - self._last) / len(self._running)
            for token in self._running:
                self._running[token] += share
        self._last = now
