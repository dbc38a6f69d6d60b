"""Progress for people and for logs: a rich bar on a terminal, one log line every 10 s otherwise.

Both say the same thing, and it moves from the first engine step:

    prompt 12,345/58,659 tok 1,234/s · rows 3/240 · 8,765 tok 250/s · ETA 0:03:21 · 0:01:10 elapsed

- prompt tokens processed (computed or served from the prefix cache) out of the total to
  prefill: the prep stream's count, extrapolated over the rows it has not read yet;
- rows finished, and tokens generated as the engine samples them (its live counters, read by a
  ticker thread), not only those of finished rows: a continuous-batching engine works on every
  row at once, so for the first minutes few rows finish while thousands of tokens are computed;
- the ETA from the work left in tokens: prompt tokens left at the rate prompts have been
  processed, then the tokens left to generate (rows left times the mean completion so far,
  max_new_tokens before any row finishes, less what rows generate meanwhile) at the rate of the
  engine's recent decode-only steps. Until such steps exist, the line says when prefill ends.

Log lines go through the bar's console while it shows, so they print above it and never break
it. JOBRUNNER_NO_PROGRESS=1 turns the bar off (log lines remain).
"""

from __future__ import annotations

import itertools
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from jobrunner.types import Result

log = logging.getLogger("jobrunner.progress")
RECENT_STEPS = 64  # recent engine steps the decode rate is measured on


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
    time_fraction: float | None = None  # time elapsed over time elapsed and left
    elapsed: float = 0.0
    generates: bool = True  # False for a job that only reads prompts (embeddings)

    @property
    def prefilling(self) -> bool:
        return self.prompt_total is not None and self.prompt_done < self.prompt_total

    def fraction(self) -> float:
        """Share of the job done: in time once there is an ETA, else prompt tokens while
        prefill leads, rows afterwards."""
        if self.rows_done >= self.rows_total:
            return 1.0
        if self.time_fraction is not None:  # below 1 until the last row is done
            return min(self.time_fraction, 0.99)
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
            prompt += f" {_rate(self.prompt_rate)}/s"
        rows = f"rows {self.rows_done:,}/{self.rows_total:,}"
        gen = f"{self.generated:,} tok {_rate(self.generate_rate)}/s"
        if not self.generates:
            eta = "ETA -" if self.eta is None else f"ETA {_clock(self.eta)}"
            return f"{prompt} · {rows} · {eta} · {_clock(self.elapsed)} elapsed"
        if self.eta is not None:
            eta = f"ETA {_clock(self.eta)}"
        elif self.prefill_eta is not None:
            eta = f"prefill ends in {_clock(self.prefill_eta)}"
        else:
            eta = "ETA -"
        return f"{prompt} · {rows} · {gen} · {eta} · {_clock(self.elapsed)} elapsed"


class Progress:
    def __init__(
        self,
        total: int,
        log_every: float = 10.0,
        live: Any | None = None,
        prompt: PromptCounter | None = None,
        max_new_tokens: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.total = max(total, 0)
        self.done = 0
        self.tokens = 0  # completion tokens of finished rows
        self.live = live  # EngineStats: generated, prefill and cached tokens, step_log
        self.prompt = prompt
        self.max_new_tokens = max_new_tokens
        self.generates = max_new_tokens != 0  # 0: a job that generates nothing (embeddings)
        self.clock = clock
        self.t0 = clock()
        self.log_every = log_every
        self._moved = {"prompt": (None, 0), "generate": (None, 0)}  # when the count last moved
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
        return self.generated / max(self.clock() - self.t0, 1e-9)

    def prompt_total(self) -> int | None:
        p = self.prompt
        if p is None or not p.rows_read:
            return None
        if p.read_done:
            return p.prompt_tokens
        return round(p.prompt_tokens / p.rows_read * max(self.total, p.rows_read))

    def snapshot(self) -> Snapshot:
        now = self.clock()
        prompt_done, generated = self.prompt_done, self.generated
        total = self.prompt_total()
        if total is not None:
            prompt_done = min(prompt_done, total)  # preempted rows compute their prompts again
        prompt_rate = self._rate("prompt", prompt_done, now)
        generate_rate = self._rate("generate", generated, now)
        prompt_left = max((total or 0) - prompt_done, 0)
        generate_left = self._generate_left(generated)
        prefill_eta = None
        if self.prompt is None or (total is not None and not prompt_left):
            prefill_eta = 0.0  # done, or no prompt counter (e.g. a worker pool's aggregate)
        elif total is not None and prompt_rate:  # counts down between the engine's steps
            since = now - (self._moved["prompt"][0] or now)
            prefill_eta = max(prompt_left / prompt_rate - since, 0.0)
        decode_rate = self._decode_rate(generate_rate)
        eta = None if self.generates else prefill_eta  # nothing to generate: prompts are all
        if self.generates and prefill_eta is not None and decode_rate:
            during = generate_rate * prefill_eta  # rows decode while prompts are still prefilled
            eta = prefill_eta + max(generate_left - during, 0) / decode_rate
        elapsed = now - self.t0
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
            elapsed / (elapsed + eta) if eta is not None and elapsed + eta > 0 else None,
            elapsed,
            self.generates,
        )

    def _rate(self, phase: str, count: int, now: float) -> float:
        """Tokens a second from the start to the latest move of the count (so a finished phase
        keeps its rate)."""
        moved, last = self._moved[phase]
        if count != last:
            moved, last = now, count
            self._moved[phase] = (moved, last)
        return count / (moved - self.t0) if moved is not None and moved > self.t0 else 0.0

    def _generate_left(self, generated: int) -> int:
        """Tokens still to generate: rows not started times the expected completion (the mean
        of finished rows, max_new_tokens before any), plus what running rows still need. A
        running row that already has more than the mean is one of the long ones: it is taken
        to stop halfway between where it is and max_new_tokens."""
        rows_left = self.total - self.done
        mean = self.tokens / self.done if self.done else self.max_new_tokens
        if not mean or rows_left <= 0:
            return 0
        in_flight = max(generated - self.tokens, 0)
        steps = getattr(self.live, "step_log", None) or []
        running = min(int(steps[-1].get("num_running") or 0), rows_left) if steps else 0
        if not running:
            return max(round(rows_left * mean) - in_flight, rows_left)
        has = in_flight / running
        cap = max(self.max_new_tokens or mean, has)
        need = mean - has if has < mean else (cap - has) / 2
        return max(round((rows_left - running) * mean + running * need), rows_left)

    def _decode_rate(self, generate_rate: float) -> float | None:
        """Generated tokens a second once no prompt is prefilled: measured on the engine's recent
        decode-only steps, in wall time (step to step). None until there are some: the rate
        while prompts are prefilled says little about it. An engine whose steps do not split
        prefill from decode (static batches) has one rate for both."""
        steps = list((getattr(self.live, "step_log", None) or [])[-RECENT_STEPS:])
        if not steps or steps[-1].get("prefill_tokens") is None:
            return generate_rate or None
        tokens = seconds = 0.0
        for prev, step in itertools.pairwise(steps):
            if step.get("prefill_tokens") == 0 and step.get("decode_tokens"):
                tokens += step["decode_tokens"]
                seconds += step["t"] - prev["t"]
        return tokens / seconds if tokens and seconds > 0 else None

    # ---------------------------------------------------------------- display

    def line(self) -> str:
        return self.snapshot().text()

    def advance(self, results: list[Result]) -> None:
        self.add(
            len(results), sum(r.usage.completion_tokens for r in results if r.shared_with <= 1)
        )

    def add(self, rows: int, completion_tokens: int) -> None:
        """`rows` more finished, with `completion_tokens` generated (a Ray block, say)."""
        self.done += rows
        self.tokens += completion_tokens
        if self._bar is not None:
            self._show()

    def _start_bar(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, TextColumn
        from rich.progress import Progress as RichProgress

        self._bar = RichProgress(
            BarColumn(bar_width=30),
            TextColumn("{task.fields[text]}"),
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


def _rate(per_second: float) -> str:
    return f"{per_second:,.1f}" if per_second < 10 else f"{per_second:,.0f}"
