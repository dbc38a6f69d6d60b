"""Progress for people and for logs: a rich bar on a terminal, one log line every 10 s otherwise.

The token rate counts tokens as the engine samples them (its live counters, read by a ticker
thread, along with the prompt tokens computed so far), not only those of finished rows: a
continuous-batching engine works on every row at once, so for the first minute of a job few rows
have finished while thousands of tokens have been generated. JOBRUNNER_NO_PROGRESS=1 turns the
bar off (log lines remain).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from typing import TYPE_CHECKING

from jobrunner.types import Result

if TYPE_CHECKING:
    from jobrunner.engine.base import EngineStats

log = logging.getLogger("jobrunner.progress")


class Progress:
    def __init__(
        self,
        total: int,
        log_every: float = 10.0,
        live: EngineStats | None = None,
    ) -> None:
        self.total = max(total, 0)
        self.done = 0
        self.tokens = 0  # completion tokens of finished rows
        self.live = live  # EngineStats: generated_tokens and prefill_tokens, updated as it runs
        self.t0 = time.monotonic()
        self.log_every = log_every
        self._bar = None
        self._stop = threading.Event()
        if sys.stderr.isatty() and not os.environ.get("JOBRUNNER_NO_PROGRESS"):
            self._start_bar()
        self._ticker = threading.Thread(target=self._tick, name="jobrunner-progress", daemon=True)
        self._ticker.start()

    def _start_bar(self) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn
        from rich.progress import Progress as RichProgress

        self._bar = RichProgress(
            TextColumn("rows"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[tps]} tok/s"),
            TimeRemainingColumn(),
            transient=False,
        )
        self._task = self._bar.add_task("rows", total=self.total or None, tps="-")
        self._bar.start()

    @property
    def generated(self) -> int:
        return max(self.live.generated_tokens if self.live is not None else 0, self.tokens)

    @property
    def tokens_per_second(self) -> float:
        return self.generated / max(time.monotonic() - self.t0, 1e-9)

    def advance(self, results: list[Result]) -> None:
        self.done += len(results)
        self.tokens += sum(r.usage.completion_tokens for r in results if r.shared_with <= 1)
        if self._bar is not None:
            self._bar.update(self._task, advance=len(results), tps=f"{self.tokens_per_second:,.0f}")

    def line(self) -> str:
        prompt = f", {self.live.prefill_tokens:,} prompt tokens computed" if self.live else ""
        return (
            f"{self.done}/{self.total} rows, {self.generated:,} tokens generated"
            f" ({self.tokens_per_second:,.0f} tok/s){prompt}"
        )

    def _tick(self) -> None:
        """The rate while no row finishes: the bar each second, a log line every log_every."""
        while not self._stop.wait(1.0 if self._bar is not None else self.log_every):
            if self._bar is not None:
                self._bar.update(self._task, tps=f"{self.tokens_per_second:,.0f}")
            else:
                log.info("%s", self.line())

    def close(self) -> None:
        self._stop.set()
        self._ticker.join(timeout=5)
        if self._bar is not None:
            self._bar.stop()
