"""Work a process does once per machine and caches (the CPU kernels' build, the dtype probe):
the seconds this process spent on it, so that a load timed for later runs (`estimate
--calibrate`) can leave out what those runs will find cached."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

_spent = [0.0]
_depth = [0]  # timed blocks open now: only the outermost counts (the probe builds the kernels)


@contextmanager
def timed() -> Iterator[None]:
    """Counts the block's wall time as first-use work, once where such blocks nest."""
    t0 = time.monotonic()
    _depth[0] += 1
    try:
        yield
    finally:
        _depth[0] -= 1
        if _depth[0] == 0:
            _spent[0] += time.monotonic() - t0


def spent() -> float:
    """Seconds of first-use work in this process so far."""
    return _spent[0]
