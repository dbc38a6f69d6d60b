"""Detokenization and stop strings, behind the forward loop in a worker thread.

The engine posts events in step order: new tokens of rows that have stop strings, and
finished rows. The worker builds the final `Result`s. When a row's text reaches a stop
string, its Result is made at once (text cut before the stop string, as OpenAI does) and
its id is reported back so the engine aborts the sequence; a later "finished" event for
that row (it may have run on meanwhile) is ignored.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, field, replace
from typing import Any

from jobrunner.engine.finish import error_result, find_stop, make_choice, make_result
from jobrunner.types import FinishReason, Request, Result, TokenLogprob, Usage


@dataclass
class FinishedRow:
    """A snapshot of a finished sequence, taken in the forward loop."""

    seq_id: int
    request: Request
    output_ids: list[int]
    reason: FinishReason
    cached_tokens: int
    error_code: str | None = None
    error: str | None = None
    work: Usage = field(default_factory=Usage)  # the sequence's work fields (telemetry.cost)
    ends: frozenset[int] = frozenset()  # the row's end tokens (Sequence.stop_token_ids)
    logprobs: list[TokenLogprob] | None = None  # one per output token, when the row asks
    structure: str | None = None  # constrained rows: the grammar's verdict (Choice.structure)


def row_result(tokenizer: Any, row: FinishedRow, text: str | None = None) -> Result:
    """The Result of a finished row (text: already cut at a stop string, else decoded here)."""
    req = row.request
    if row.reason is FinishReason.ERROR:
        return error_result(
            req,
            row.error_code or "error",
            row.error or "",
            len(row.output_ids),
            row.cached_tokens,
            row.work,
        )
    choice = make_choice(
        tokenizer,
        req,
        row.output_ids,
        row.reason,
        row.ends,
        row.logprobs,
        text=text,
        structure=row.structure,
    )
    return make_result(req, [choice], row.cached_tokens, row.work)


class _StopWatch:
    """Incremental text of one row with stop strings. Each token decodes only a short window
    (the tokens since the last step, behind the previous step's tokens for context), so a long
    output costs O(n), not O(n^2) decodes. A stop found in that text is confirmed on one full
    decode, which also gives the exact text the row ends with."""

    def __init__(self, seq: Any):
        self.seq = seq  # read only for num_cached_tokens, fixed before its first token
        self.request = seq.request
        self.stops = self.request.sampling.stop
        self.max_stop = max(len(s) for s in self.stops)
        self.output_ids: list[int] = []
        self.text = ""  # the text of output_ids[:read]
        self.prefix = 0  # the window decoded for a new token starts at this token
        self.read = 0
        self.checked = 0  # self.text before this index holds no stop string start

    def feed(self, tokenizer: Any, token_id: int) -> tuple[str, int]:
        """(the row's text, the index of a stop string in it or -1)."""
        self.output_ids.append(token_id)
        ids = self.output_ids
        seen = tokenizer.decode(ids[self.prefix : self.read], skip_special_tokens=True)
        window = tokenizer.decode(ids[self.prefix :], skip_special_tokens=True)
        if len(window) <= len(seen) or window.endswith("\ufffd"):  # a character still incomplete
            return self.text, -1
        self.text += window[len(seen) :]
        self.prefix, self.read = self.read, len(ids)
        hit = find_stop(self.text, self.stops, self.checked)
        self.checked = max(0, len(self.text) - self.max_stop)
        if hit < 0:
            return self.text, -1
        full = tokenizer.decode(ids, skip_special_tokens=True)
        return full, find_stop(full, self.stops)  # once a row: the earliest, exactly


class Detokenizer:
    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self._inbox: queue.Queue = queue.Queue()
        self._results: queue.Queue[Result] = queue.Queue()
        self._stop_hits: queue.Queue[int] = queue.Queue()
        self._watches: dict[int, _StopWatch] = {}
        self._done: set[int] = set()
        self._thread = threading.Thread(target=self._work, name="detok", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ engine side

    def watch(self, seq: Any) -> None:
        """Follow a sequence (sched.Sequence) whose request has stop strings."""
        if seq.request.sampling.stop:
            self._inbox.put(("watch", seq))

    def tokens(self, items: list[tuple[int, int]]) -> None:
        """(seq_id, token_id) pairs of watched rows, in step order."""
        if items:
            self._inbox.put(("tokens", items))

    def finished(self, row: FinishedRow) -> None:
        self._inbox.put(("finished", row))

    def result(self, result: Result) -> None:
        self._results.put(result)

    def drain(self) -> list[Result]:
        return _drain(self._results)

    def stop_hits(self) -> list[int]:
        return _drain(self._stop_hits)

    def close(self) -> list[Result]:
        """Finish all posted work; returns the last Results."""
        self._inbox.put(None)
        self._thread.join()
        return self.drain()

    # ------------------------------------------------------------------ worker

    def _work(self) -> None:
        while (event := self._inbox.get()) is not None:
            kind, *args = event
            getattr(self, f"_on_{kind}")(*args)

    def _on_watch(self, seq: Any) -> None:
        self._watches[seq.seq_id] = _StopWatch(seq)

    def _on_tokens(self, items: list[tuple[int, int]]) -> None:
        for seq_id, token_id in items:
            watch = self._watches.get(seq_id)
            if watch is None:
                continue
            text, hit = watch.feed(self.tokenizer, token_id)
            if hit >= 0:
                seq, n = watch.seq, len(watch.output_ids)
                logprobs = seq.sampler.logprobs if seq.sampler is not None else None
                row = FinishedRow(
                    seq_id,
                    watch.request,
                    list(watch.output_ids),
                    FinishReason.STOP,
                    seq.num_cached_tokens,
                    work=replace(seq.work),
                    logprobs=None if logprobs is None else logprobs[:n],
                    structure=_cut(watch.request),
                )
                self._emit(row, text[:hit])
                self._stop_hits.put(seq_id)

    def _on_finished(self, row: FinishedRow) -> None:
        if row.seq_id in self._done:  # already ended by a stop string
            self._done.discard(row.seq_id)
            return
        self._watches.pop(row.seq_id, None)
        self._results.put(row_result(self.tokenizer, row))

    def _emit(self, row: FinishedRow, text: str) -> None:
        self._watches.pop(row.seq_id, None)
        self._done.add(row.seq_id)
        self._results.put(row_result(self.tokenizer, row, text))


def _cut(request: Request) -> str | None:
    """A stop string cut the text: a constrained row's value is no longer whole."""
    return "incomplete" if request.sampling.structured is not None else None


def _drain(q: queue.Queue) -> list:
    out = []
    while True:
        try:
            out.append(q.get_nowait())
        except queue.Empty:
            return out
