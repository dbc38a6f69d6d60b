"""Progress for people and for logs: a rich bar on a terminal, one log line every 10 s otherwise.

Both say the same thing, and it moves from the first engine step:

    prompt 12,345/58,659 tok 1,234/s · rows 3/240 · 8,765 tok 250/s · ETA 0:03:21

- prompt tokens processed (computed or served from the prefix cache) out of the total to
  prefill: the prep stream's count, extrapolated over the rows it has not read yet;
- rows finished, and tokens generated as the engine samples them (its live counters, read by a
  ticker thread), not only those of finished rows: a continuous-batching engine works on every
  row at once, so for the first minutes few rows finish while thousands of tokens are computed;
- the ETA from the work left in tokens: prompt tokens left times the seconds per prompt token,
  plus tokens left to generate (rows left times the mean completion so far, max_new_tokens
  before any row finishes) times the seconds per generated token. Both costs are fitted to the
  engine's recent steps (`telemetry.throughput.nnls`), which share their time between prefill
  and decode; without a step log, each phase's own rate.

Log lines go through the bar's console while it shows, so they print above it and never break
it. JOBRUNNER_NO_PROGRESS=1 turns the bar off (log lines remain).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Protocol

from jobrunner.types import Result

log = logging.getLogger("jobrunner.progress")
FIT_STEPS = 128  # recent engine steps the ETA's token costs are fitted to


class PromptCounter(Protocol):
    """What the prep stream knows of the prompts: tokens and rows so far, and whether it is done."""

    prompt_tokens: int
    rows_read: int
    read_done: bool


@dataclass(frozen=True)
class Snapshot:
    """The figures the bar and the log line show (ints are tokens or rows, floats seconds)."""

    prompt_done: int
    prompt_total: int | None  # None: not known yet
    prompt_rate: float
    rows_done: int
    rows_total: int
    generated: int
    generate_rate: float
    eta: float | None  # seconds; None before a cost per generated token is known
    prefill_eta: float | None  # seconds until every known prompt token is processed
    work_fraction: float | None = None  # work done over work done and left, in seconds

    @property
    def prefilling(self) -> bool:
        return self.prompt_total is not None and self.prompt_done < self.prompt_total

    def fraction(self) -> float:
        """Share of the work done: in seconds of work once both token costs are known, else
        prompt tokens while prefill leads, rows afterwards."""
        if self.work_fraction is not None:
            return self.work_fraction
        if self.prefilling and not self.rows_done:
            return self.prompt_done / max(self.prompt_total or 1, 1)
        return self.rows_done / max(self.rows_total, 1)

    def text(self) -> str:
        if self.prompt_total is None:
            prompt = f"prompt {self.prompt_done:,} tok"
        elif self.prefilling:
            prompt = f"prompt {self.prompt_done:,}/{self.prompt_total:,} tok"
        else:
            prompt = f"prompt {self.prompt_total:,} tok done"
        if self.prefilling or not self.prompt_total:
            prompt += f" {self.prompt_rate:,.0f}/s"
        rows = f"rows {self.rows_done:,}/{self.rows_total:,}"
        gen = f"{self.generated:,} tok {self.generate_rate:,.0f}/s"
        if self.eta is not None:
            eta = f"ETA {_clock(self.eta)}"
        elif self.prefill_eta is not None:
            eta = f"prefill ends in {_clock(self.prefill_eta)}"
        else:
            eta = "ETA -"
        return f"{prompt} · {rows} · {gen} · {eta}"


class Progress:
    def __init__(
        self,
        total: int,
        log_every: float = 10.0,
        live: Any | None = None,
        prompt: PromptCounter | None = None,
        max_new_tokens: int | None = None,
    ) -> None:
        self.total = max(total, 0)
        self.done = 0
        self.tokens = 0  # completion tokens of finished rows
        self.live = live  # EngineStats: generated, prefill and cached tokens, step_log
        self.prompt = prompt
        self.max_new_tokens = max_new_tokens
        self.t0 = time.monotonic()
        self.log_every = log_every
        # per phase: when it began, when its count last moved, that count
        self._phase: dict[str, list] = {"prompt": [self.t0, None, 0], "generate": [None, None, 0]}
        self._bar = None
        self._restore: list[tuple[logging.StreamHandler, Any]] = []
        self._stop = threading.Event()
        if sys.stderr.isatty() and not os.environ.get("JOBRUNNER_NO_PROGRESS"):
            self._start_bar()
        self._ticker = threading.Thread(target=self._tick, name="jobrunner-progress", daemon=True)
        self._ticker.start()

    # ---------------------------------------------------------------- figures

    @property
    def generated(self) -> int:
        return max(int(getattr(self.live, "generated_tokens", 0) or 0), self.tokens)

    @property
    def prompt_done(self) -> int:
        live = self.live
        return int(getattr(live, "prefill_tokens", 0) or 0) + int(
            getattr(live, "cached_tokens", 0) or 0
        )

    @property
    def tokens_per_second(self) -> float:
        return self.generated / max(time.monotonic() - self.t0, 1e-9)

    def prompt_total(self) -> int | None:
        p = self.prompt
        if p is None or not p.rows_read:
            return None
        if p.read_done:
            return p.prompt_tokens
        return round(p.prompt_tokens / p.rows_read * max(self.total, p.rows_read))

    def snapshot(self) -> Snapshot:
        now = time.monotonic()
        prompt_done, generated = self.prompt_done, self.generated
        total = self.prompt_total()
        if total is not None:
            prompt_done = min(prompt_done, total)  # preempted rows compute their prompts again
        prompt_rate = self._rate("prompt", prompt_done, now)
        generate_rate = self._rate("generate", generated, now)
        prompt_left = max((total or 0) - prompt_done, 0)
        generate_left = self._generate_left(generated)
        cost_p, cost_g = self._token_costs(prompt_rate, generate_rate)
        prefill_eta = None
        if total is not None and (cost_p is not None or not prompt_left):
            prefill_eta = prompt_left * (cost_p or 0.0)
        elif self.prompt is None:
            prefill_eta = 0.0  # no prompt counter (e.g. a worker pool's aggregate)
        eta = work = None
        if cost_g is not None and prefill_eta is not None:
            eta = prefill_eta + generate_left * cost_g
            work = prompt_done * (cost_p or 0.0) + generated * cost_g
        return Snapshot(
            prompt_done,
            total,
            prompt_rate,
            self.done,
            self.total,
            generated,
            generate_rate,
            eta,
            prefill_eta,
            work / (work + eta) if work and eta is not None else None,
        )

    def _rate(self, phase: str, count: int, now: float) -> float:
        """Tokens a second over the time this phase has moved (its start to its latest move)."""
        state = self._phase[phase]
        if count and state[0] is None:
            state[0] = now - 1.0  # first seen on this tick: it began within the last second
        if count != state[2]:
            state[1], state[2] = now, count
        first, last = state[0], state[1]
        return count / max(last - first, 1e-9) if first is not None and last else 0.0

    def _generate_left(self, generated: int) -> int:
        """Rows left times the expected completion, less what unfinished rows already have."""
        if self.done:
            mean = self.tokens / self.done
        elif self.max_new_tokens:
            mean = self.max_new_tokens
        else:
            return 0
        in_flight = max(generated - self.tokens, 0)
        return max(round((self.total - self.done) * mean) - in_flight, 0)

    def _token_costs(
        self, prompt_rate: float, generate_rate: float
    ) -> tuple[float | None, float | None]:
        """Seconds per prompt token and per generated token (None where not yet known)."""
        steps = list(getattr(self.live, "step_log", None) or [])[-FIT_STEPS:]
        pts = [
            (float(s["prefill_tokens"]), float(s["decode_tokens"]), float(s["step_seconds"]))
            for s in steps
            if s.get("prefill_tokens") is not None and s.get("step_seconds") is not None
        ]
        cost_p = 1 / prompt_rate if prompt_rate else None
        cost_g = 1 / generate_rate if generate_rate else None
        if pts:  # the engine's steps share their time between the two kinds of token
            from jobrunner.telemetry.throughput import nnls

            a, b = nnls(pts)
            if a > 0 and any(p[0] for p in pts):
                cost_p = a
            if b > 0 and any(p[1] for p in pts):
                cost_g = b
        return cost_p, cost_g

    # ---------------------------------------------------------------- display

    def line(self) -> str:
        return self.snapshot().text()

    def advance(self, results: list[Result]) -> None:
        self.done += len(results)
        self.tokens += sum(r.usage.completion_tokens for r in results if r.shared_with <= 1)
        if self._bar is not None:
            self._show()

    def _start_bar(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, TextColumn, TimeElapsedColumn
        from rich.progress import Progress as RichProgress

        self._bar = RichProgress(
            BarColumn(bar_width=30),
            TextColumn("{task.fields[text]}"),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            redirect_stdout=False,  # stdout carries the JSON summary, nothing else
            transient=False,
        )
        self._task = self._bar.add_task("job", total=1.0, text="starting")
        self._bar.start()
        self._route_logs(sys.stderr)  # rich's proxy: log lines print above the bar

    def _route_logs(self, stream: Any) -> None:
        for h in logging.getLogger().handlers:
            if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler):
                real = getattr(h.stream, "rich_proxied_file", h.stream)
                if h.stream is not stream and real in (sys.__stderr__, stream):
                    self._restore.append((h, h.setStream(stream)))

    def _show(self) -> None:
        snap = self.snapshot()
        self._bar.update(self._task, completed=snap.fraction(), text=snap.text())

    def _tick(self) -> None:
        """The figures while no row finishes: the bar each second, a log line every log_every."""
        while not self._stop.wait(1.0 if self._bar is not None else self.log_every):
            if self._bar is not None:
                self._show()
            else:
                log.info("%s", self.line())

    def close(self) -> None:
        self._stop.set()
        self._ticker.join(timeout=5)
        if self._bar is not None:
            self._show()
            self._bar.stop()
            for handler, stream in self._restore:
                handler.setStream(stream)
            self._restore.clear()


def _clock(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"
