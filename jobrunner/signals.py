"""Turning SIGTERM/SIGINT into an exception, for the stretches where exiting at once is safe
(commits are atomic): before rows are generated, and in the Ray driver."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class SignalLatch:
    """Remembers a stop signal turned into an exception, so that the stop still happens when
    library code with a broad `except Exception` swallowed that exception (model loading does):
    `reraise()` at the end of the stretch raises it again."""

    def __init__(self, make_error: Callable[[int], BaseException]) -> None:
        self.make_error = make_error
        self.signum: int | None = None

    def reraise(self) -> None:
        if self.signum is not None:
            raise self.make_error(self.signum)


@contextlib.contextmanager
def raise_on_signal(make_error: Callable[[int], BaseException]) -> Iterator[SignalLatch]:
    """Inside the block, SIGTERM/SIGINT raise make_error(signum); the latch yielded remembers
    it. A no-op off the main thread (Python only lets the main thread install handlers)."""
    latch = SignalLatch(make_error)

    def on_signal(signum, frame):
        latch.signum = signum
        raise make_error(signum)

    if threading.current_thread() is not threading.main_thread():
        yield latch
        return
    old = {s: signal.signal(s, on_signal) for s in STOP_SIGNALS}
    try:
        yield latch
    finally:
        for s, h in old.items():
            signal.signal(s, h)
