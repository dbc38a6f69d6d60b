"""Stage 1: read, render, tokenize, validate, dedup, order, ahead of the engine.

`Prep` turns rows into Requests (for a whole input, or one Ray block); `PrepStream` runs it over
the job's input in a thread that fills a bounded queue the engine pulls from. Rows already
committed are skipped; rows rejected at input go to `drain_errors()` (the committer takes them).
Exact duplicate greedy requests run once: the first is the leader and the rest ride along until
its result fans out to them.
"""

from __future__ import annotations

import contextlib
import functools
import queue
import threading
from array import array
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from typing import Any

from jobrunner.config import JobConfig
from jobrunner.formats import make_preparer
from jobrunner.io.ids import IdSet, committed
from jobrunner.io.readers import Item
from jobrunner.io.row_ranges import CommittedRows
from jobrunner.prep.fresh import FreshRows
from jobrunner.prep.order import order_requests
from jobrunner.types import Request, Result, RowError, SamplingParams

_END = object()
CHECK_ROWS = 256  # rows checked against the committed ids at once (one vectorized lookup)


def dedup_key(r: Request) -> tuple[bytes, str] | None:
    """Identical prompt and parameters under greedy decoding give identical output. The key is
    the prompt's ids and the parameters themselves (no digest: equal keys are equal rows)."""
    if not r.sampling.greedy:
        return None
    settings = _settings(r.sampling, r.meta.get("dimensions") if r.meta else None)
    return array("q", r.prompt_token_ids).tobytes(), settings


_last_settings: tuple[Any, Any, str] = (None, None, "")


def _settings(sampling: SamplingParams, dims: Any) -> str:
    """The parameters' repr; rows of one job share one SamplingParams object, so the last one
    is kept by identity (hashing the dataclass per row cost more than the row's key)."""
    global _last_settings
    last = _last_settings
    if last[0] is sampling and last[1] == dims:
        return last[2]
    out = _settings_text(sampling, dims)
    _last_settings = (sampling, dims, out)
    return out


@functools.lru_cache(maxsize=1024)
def _settings_text(sampling: SamplingParams, dims: Any) -> str:
    """repr of the parameters (hashable by value): one per distinct setting, not per row."""
    return repr((sampling, dims))


class Prep:
    """Rows -> the Requests the engine runs, for a whole input or one block of it: rows already
    committed are skipped, rejected rows set aside (`drain_errors`), exact duplicate greedy
    requests run once (`fan_out` copies the leader's result), and the rest is ordered for the
    prefix cache (prep/order.py). Thread-safe between the producer and the consumer."""

    def __init__(
        self,
        cfg: JobConfig,
        tokenizer: Any,
        skip_ids: IdSet | set[str] | frozenset[str] = frozenset(),
        order: bool = True,
        compile_grammar: Callable[[Any], None] | None = None,
    ) -> None:
        """`compile_grammar(spec)` (the engine's) compiles a constrained row's grammar here, in
        the background, so compiling overlaps the forward pass; a ValueError from it fails the
        row (named by row and schema path), not the job."""
        self.compile_grammar = compile_grammar
        self.preparer = make_preparer(cfg, tokenizer)
        self.skip_ids = skip_ids
        self.window = cfg.engine.order_window if order else 0
        self._lock = threading.Lock()
        self._errors: list[RowError] = []
        self._inflight: dict[tuple, list[Request]] = {}  # leader key -> followers
        self._leader_key: dict[str, tuple] = {}
        self._skipped = 0  # rows the committed check dropped here (FreshRows counts its own)
        self.deduplicated = 0
        # progress: rows read (not skipped), prompt tokens they need prefilled
        self.rows_read = 0
        self.prompt_tokens = 0

    def requests(self, items: Iterable[Item]) -> Iterator[Request]:
        fresh = self._fresh(self.preparer.prepare(items))
        return order_requests(fresh, self.window) if self.window else fresh

    @property
    def skipped(self) -> int:
        """Input rows skipped as already committed."""
        return self._skipped

    def drain_errors(self) -> list[RowError]:
        with self._lock:
            out, self._errors = self._errors, []
        return out

    def fan_out(self, leader: Result) -> list[Result]:
        """The leader's result copied to each follower; cost is split across all of them."""
        with self._lock:
            key = self._leader_key.pop(leader.id, None)
            followers = self._inflight.pop(key, []) if key else []
        return copy_to_followers(leader, followers)

    def _fresh(self, prepared: Iterable[Request | RowError]) -> Iterator[Request]:
        for chunk in _chunks(prepared, CHECK_ROWS):
            done = committed(self.skip_ids, [item.id for item in chunk])
            for item, skip in zip(chunk, done, strict=True):
                if skip:
                    self._skipped += 1
                    continue
                self.rows_read += 1
                if not isinstance(item, RowError):
                    item = self._compiled(item)
                if isinstance(item, RowError):
                    with self._lock:
                        self._errors.append(item)
                elif not self._is_follower(item):
                    self.prompt_tokens += item.num_prompt_tokens
                    yield item

    def _compiled(self, r: Request) -> Request | RowError:
        spec = r.sampling.structured
        if spec is None or self.compile_grammar is None:
            return r
        try:
            self.compile_grammar(spec)
        except ValueError as e:  # structured.grammar.GrammarError
            return RowError("bad_schema", f"{r.source}: {e}", r.source, r.id, spec.where)
        return r

    def _is_follower(self, r: Request) -> bool:
        key = dedup_key(r)
        if key is None:
            return False
        with self._lock:
            if key in self._inflight:
                self._inflight[key].append(r)
                self.deduplicated += 1
                return True
            self._inflight[key] = []
            self._leader_key[r.id] = key
        return False


class PrepStream(Prep):
    """Prep over the job's whole input in a background thread, ahead of the engine: a bounded
    queue that `requests()` drains."""

    def __init__(
        self,
        cfg: JobConfig,
        tokenizer: Any,
        skip_ids: IdSet | set[str],
        order: bool = True,
        depth: int = 4096,
        compile_grammar: Callable[[Any], None] | None = None,
        committed_rows: Callable[[], CommittedRows] = CommittedRows,
    ) -> None:
        """`committed_rows()` (read in the thread): the row ranges FreshRows skips unread."""
        super().__init__(cfg, tokenizer, skip_ids, order, compile_grammar)
        self.committed_rows = committed_rows
        self.cfg = cfg
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self.failure: BaseException | None = None
        self.read_done = False  # progress: the input was read to the end
        self._rows: FreshRows | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="jobrunner-prep", daemon=True)

    def start(self) -> PrepStream:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    @property
    def skipped(self) -> int:
        """Input rows skipped as already committed, the reader's (FreshRows) included."""
        return self._skipped + (self._rows.skipped if self._rows else 0)

    def stream(self) -> Iterator[Request]:
        while True:
            item = self._queue.get()
            if item is _END:
                if self.failure:
                    raise self.failure
                return
            yield item

    # ---------------------------------------------------------------- worker

    def _run(self) -> None:
        try:
            self._rows = FreshRows(self.cfg, self.skip_ids, self.committed_rows())
            for req in self.requests(self._rows):
                if self._stop.is_set():
                    break
                self._put(req)
        except BaseException as e:  # surfaced in the engine's thread by stream()
            self.failure = e
        finally:
            self.read_done = True
            self._put(_END)

    def _put(self, item: object) -> None:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.2)
                return
            except queue.Full:
                continue
        if item is _END:  # make room so the consumer always sees the end
            with contextlib.suppress(queue.Full):
                self._queue.put_nowait(item)


def _chunks(items: Iterable, n: int) -> Iterator[list]:
    chunk: list = []
    for item in items:
        chunk.append(item)
        if len(chunk) >= n:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def copy_to_followers(leader: Result, followers: list[Request]) -> list[Result]:
    """A leader's result as each duplicate row's own; all of them split its cost."""
    if not followers:
        return []
    leader.shared_with = 1 + len(followers)
    return [
        replace(
            leader,
            id=f.id,
            source=f.source,
            columns=f.columns,
            meta=f.meta,
            usage=replace(leader.usage),
        )
        for f in followers
    ]
