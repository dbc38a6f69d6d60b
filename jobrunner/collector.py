"""Python's cyclic garbage collector during a run: none at start-up, then fewer, cheaper ones.

Start-up (the CLI, the imports of torch and transformers, the model's load) makes hundreds of
thousands of objects that live as long as the process and almost no garbage, and every full
collection walks all of them again: seven in a run's start-up, about 1 s of its 7 (Zen 4; the
imports alone 3.9 -> 3.3 s without them). So `jobrunner run` and `start_engine` `pause()` the
collector and `resume()` it once the engine is ready (a Ray driver: as its loop starts; `run`
itself when it ends, however it ends). One process-wide flag, not a count: any `resume()` ends
the pause. The other commands, which read inputs or telemetry row by row, keep collecting.

Preparation makes several container objects a row (the row's dict, its token ids, its Request)
and holds thousands of them in the order window and the queue, so at the collector's default
threshold (a young collection every 700 allocations) each survives several collections, and
every full collection walks everything the process holds (torch, transformers, the model).
A run freezes what exists once its engine has started (`gc.freeze`: never walked again) and
collects the young generation every YOUNG_THRESHOLD allocations, by which time most rows' objects
are gone. Collections hold the GIL, so this is the engine thread's time as well.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

_paused = [False]  # whether pause() turned the collector off (and resume() turns it on)

YOUNG_THRESHOLD = 50_000  # allocations between young collections (Python's default: 700)
MIDDLE_THRESHOLD = 20  # young collections between middle ones (default: 10)


def pause() -> None:
    """No collections until `resume()`; nothing when the collector is off already."""
    if gc.isenabled():
        gc.disable()
        _paused[0] = True


def resume() -> None:
    """The collector on again if `pause()` turned it off; idempotent."""
    if _paused[0]:
        _paused[0] = False
        gc.enable()


def settle() -> tuple[int, ...]:
    """Freeze every object so far and raise the thresholds; returns the old thresholds."""
    old = gc.get_threshold()
    gc.collect()  # the garbage of start-up is not frozen with the rest
    gc.freeze()
    gc.set_threshold(max(old[0], YOUNG_THRESHOLD), max(old[1], MIDDLE_THRESHOLD), *old[2:])
    return old


@contextlib.contextmanager
def settled() -> Iterator[None]:
    """`settle()` for the block; afterwards the old thresholds, and frozen objects collectable
    again (a process that runs several jobs, as the tests do, keeps no garbage for good)."""
    old = settle()
    try:
        yield
    finally:
        gc.set_threshold(*old)
        gc.unfreeze()
