"""Turning SIGTERM/SIGINT into an exception, for the stretches where exiting at once is safe
(commits are atomic): before rows are generated, and in the Ray driver."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextlib.contextmanager
def raise_on_signal(make_error: Callable[[int], BaseException]) -> Iterator[None]:
    """Inside the block, SIGTERM/SIGINT raise make_error(signum). A no-op off the main thread
    (Python only lets the main thread install handlers)."""

    def on_signal(signum, frame):
        raise make_error(signum)

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.signal(s, on_signal) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
