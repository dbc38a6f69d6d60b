"""The whole-input pass a run finishes while its engine starts, settled before its first commit.

`resume.start_run` hands the run an `InputCheck`: the pass (every id hashed, duplicates and
strays looked for, row digests written) runs in a thread; `wait()` joins it, re-raises what it
raised (the run then stops before committing anything) and runs `settle` (the manifest that
names the input) once. A run calls `wait()` before its first commit and before it finishes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

Scan = Callable[[threading.Event], None]  # checks the input; returns early once the event is set


class InputCheck:
    def __init__(self, scan: Scan | None = None, settle: Callable[[], None] | None = None) -> None:
        self._scan, self._settle = scan, settle
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._failure: BaseException | None = None
        self._settled = scan is None and settle is None
        self._thread = threading.Thread(target=self._run, name="jobrunner-input-check", daemon=True)

    def start(self) -> InputCheck:
        if self._scan is not None:
            self._thread.start()
        return self

    def wait(self) -> None:
        """Block until the input is checked; raise what the check found. Idempotent."""
        with self._lock:
            if self._thread.is_alive() or self._thread.ident is not None:
                self._thread.join()
            if self._failure is not None:
                raise self._failure
            if not self._settled:
                if self._settle is not None:
                    self._settle()
                self._settled = True

    def cancel(self) -> None:
        """The run ended without waiting: stop the pass and drop what it made."""
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join()

    def _run(self) -> None:
        _lower_priority()
        try:
            self._scan(self._stop)
        except BaseException as e:  # raised by wait(), in the run's thread
            self._failure = e


def _lower_priority() -> None:
    """This thread (and the pool threads it starts) yields the CPU to the engine's: the check
    only has to be done by the first commit, the first token should not wait behind it."""
    import contextlib
    import os

    with contextlib.suppress(AttributeError, OSError):  # elsewhere: the thread keeps its own
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)  # Linux: per thread
