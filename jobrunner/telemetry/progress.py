"""Progress for people and for logs: a rich bar on a terminal, one log line every 10 s otherwise.

JOBRUNNER_NO_PROGRESS=1 turns the bar off (log lines remain).
"""

from __future__ import annotations

import logging
import os
import sys
import time

from jobrunner.types import Result

log = logging.getLogger("jobrunner.progress")


class Progress:
    def __init__(self, total: int, log_every: float = 10.0) -> None:
        self.total = max(total, 0)
        self.done = 0
        self.tokens = 0
        self.t0 = time.monotonic()
        self._next_log = self.t0 + log_every
        self.log_every = log_every
        self._bar = None
        if sys.stderr.isatty() and not os.environ.get("JOBRUNNER_NO_PROGRESS"):
            self._start_bar()

    def _start_bar(self) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn
        from rich.progress import Progress as RichProgress

        self._bar = RichProgress(TextColumn("rows"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[tps]} tok/s"), TimeRemainingColumn(),
                                 transient=False)
        self._task = self._bar.add_task("rows", total=self.total or None, tps="-")
        self._bar.start()

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / max(time.monotonic() - self.t0, 1e-9)

    def advance(self, results: list[Result]) -> None:
        self.done += len(results)
        self.tokens += sum(r.usage.completion_tokens for r in results if r.shared_with <= 1)
        if self._bar is not None:
            self._bar.update(self._task, advance=len(results), tps=f"{self.tokens_per_second:,.0f}")
        elif time.monotonic() >= self._next_log:
            self._next_log = time.monotonic() + self.log_every
            log.info("%d/%d rows, %.0f completion tok/s", self.done, self.total, self.tokens_per_second)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
