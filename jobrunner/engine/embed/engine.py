"""`task: embed`: one vector per request, from prefill-only forwards (engine/embed/).

Requests are read in windows of `engine.order_window`, sorted by length and packed into
batches under `engine.max_batch_tokens` (at most `engine.max_num_seqs` sequences), so a batch
holds sequences of close lengths and packed backends compute no padding at all. Each vector is
pooled as the model says (pooling.py), through its Dense layers if it has them (head.py), truncated to the row's `dimensions` and L2-normalized
(`embedding.normalize`). A batch that runs out of memory is split in two and retried; a single
row that still does not fit fails alone. On a CPU, encoder batches run on single-threaded
workers, several at once (workers.py); results come back in batch order either way.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Iterator
from itertools import islice

import torch

from jobrunner.engine.base import Engine
from jobrunner.engine.embed.head import Head
from jobrunner.engine.embed.st_files import pooling_mode
from jobrunner.engine.embed.workers import SharedClock, in_workers
from jobrunner.errors import ConfigError
from jobrunner.types import Request, Result, Usage

log = logging.getLogger(__name__)


def is_oom(e: BaseException) -> bool:
    return isinstance(e, torch.OutOfMemoryError) or (
        isinstance(e, RuntimeError) and "out of memory" in str(e)
    )


def length_batches(reqs: list[Request], max_tokens: int, max_seqs: int) -> list[list[Request]]:
    """Requests sorted by length, cut into runs under the token and sequence budgets (a request
    longer than the budget is a batch of its own)."""
    batches: list[list[Request]] = []
    cur: list[Request] = []
    tokens = 0
    for r in sorted(reqs, key=lambda r: r.num_prompt_tokens):
        n = r.num_prompt_tokens
        if cur and (tokens + n > max_tokens or len(cur) >= max_seqs):
            batches.append(cur)
            cur, tokens = [], 0
        cur.append(r)
        tokens += n
    if cur:
        batches.append(cur)
    return batches


def finish_vector(v: torch.Tensor, dimensions: int | None, normalize: bool) -> list[float]:
    """OpenAI's `dimensions`: keep the first N values, then (if asked) L2-normalize."""
    if dimensions:
        v = v[:dimensions]
    if normalize:
        v = torch.nn.functional.normalize(v, dim=0)
    return v.tolist()


class EmbedEngine(Engine):
    kind = "embed"

    def __init__(self, loaded, cfg) -> None:
        super().__init__(loaded, cfg)
        from jobrunner.engine.embed.backends import make_backend

        e = cfg.engine
        if e.num_threads and loaded.device.type == "cpu":
            torch.set_num_threads(e.num_threads)
        self.batch_tokens = e.batch_tokens(loaded.device.type)
        self.decoder = is_decoder(loaded.model)
        self.pooling = pooling_mode(cfg.model.pooling, loaded.weights_dir, self.decoder)
        self.backend = make_backend(loaded, cfg, self.decoder)
        self.workers = cpu_workers(cfg, loaded.device, self.backend)
        hidden = int(loaded.hf_config.hidden_size)  # each pooled vector's values
        self.head = Head(loaded.weights_dir, hidden, cfg.model.allow_pickle)
        self.width = self.head.width  # each vector's values, after the model's Dense layers
        if (cfg.embedding.dimensions or 0) > self.width:
            raise ConfigError(
                f"embedding.dimensions is {cfg.embedding.dimensions}, but the model's vectors"
                f" have {self.width} values: set it to {self.width} or fewer, or leave it out"
            )
        self._stats_lock = threading.Lock()
        self._clock = SharedClock()  # overlapping batches share the wall time they ran in
        name = type(self.backend).__name__
        self.stats.notes.append(f"embed: {name}, {self.pooling} pooling, {self.workers} worker(s)")
        log.info("embeddings: %s, %s pooling, %d worker(s)", name, self.pooling, self.workers)

    def generate(self, requests: Iterable[Request]) -> Iterator[Result]:
        self._t0 = time.perf_counter()
        try:
            batches = self._batches(iter(requests))
            if self.workers > 1:
                yield from in_workers(self._run, batches, self.workers)
            else:
                for batch in batches:
                    yield from self._run(batch)
        finally:
            self.stats.engine_seconds += time.perf_counter() - self._t0

    def _batches(self, pending: Iterator[Request]) -> Iterator[list[Request]]:
        e = self.cfg.engine
        while not self._stop_requested and (window := list(islice(pending, e.order_window))):
            for batch in length_batches(window, self.batch_tokens, e.max_num_seqs):
                if self._stop_requested:
                    return
                yield batch

    def _run(self, batch: list[Request]) -> list[Result]:
        """`seconds`: the batch's share of the wall time (SharedClock), not its own duration:
        with N workers their durations add up to N times the wall clock."""
        token = self._clock.start()
        try:
            pooled = self.backend.embed([r.prompt_token_ids for r in batch], self.pooling)
            vectors = self.head(pooled.cpu())
        except Exception as exc:
            self._clock.stop(token)
            if not is_oom(exc):
                raise
            with self._stats_lock:
                self.stats.oom_retries += 1
            if len(batch) == 1:
                return [self._failed(batch[0], "oom", f"out of memory embedding the row: {exc}")]
            half = len(batch) // 2
            return self._run(batch[:half]) + self._run(batch[half:])
        seconds = self._clock.stop(token)
        self._record(batch, seconds)
        tokens = sum(r.num_prompt_tokens for r in batch)
        return [
            self._result(r, v, seconds * r.num_prompt_tokens / tokens)
            for r, v in zip(batch, vectors, strict=True)
        ]

    def _result(self, r: Request, v: torch.Tensor, seconds: float) -> Result:
        """`seconds`: the row's share of its batch's time, by its tokens (cost by work)."""
        if not bool(torch.isfinite(v).all()):
            return self._failed(r, "non_finite", "the model produced a non-finite embedding")
        dims = r.meta.get("dimensions") or self.cfg.embedding.dimensions
        if dims and dims > v.numel():  # a batch line's body.dimensions
            return self._failed(
                r, "bad_body", f"dimensions {dims}: the model's vectors have {v.numel()} values"
            )
        vec = finish_vector(v, dims, self.cfg.embedding.normalize)
        usage = Usage(prompt_tokens=r.num_prompt_tokens)
        usage.add_step(r.num_prompt_tokens, False, seconds)
        return embed_result(r, usage, embedding=vec)

    def _failed(self, r: Request, code: str, message: str) -> Result:
        usage = Usage(prompt_tokens=r.num_prompt_tokens)
        return embed_result(r, usage, error_code=code, error=message)

    def _record(self, batch: list[Request], seconds: float) -> None:
        with self._stats_lock:  # batches may finish on several workers at once
            self._record_locked(batch, seconds)

    def _record_locked(self, batch: list[Request], seconds: float) -> None:
        s, tokens = self.stats, sum(r.num_prompt_tokens for r in batch)
        s.steps += 1
        s.forward_seconds += seconds
        s.prefill_tokens += tokens
        s.step_log.append(
            {
                "t": round(time.perf_counter() - self._t0, 4),
                "num_running": len(batch),
                "num_waiting": 0,
                "batch_tokens": tokens,
                "prefill_tokens": tokens,
                "decode_tokens": 0,
                "kv_blocks_used": 0,
                "step_seconds": round(seconds, 5),
                "preemptions": 0,
            }
        )


def embed_result(r: Request, usage: Usage, **fields) -> Result:
    """An embed row's Result: no choices; `embedding` set when it succeeded, `error_code` and
    `error` when it failed."""
    return Result(
        id=r.id,
        choices=[],
        usage=usage,
        source=r.source,
        columns=r.columns,
        meta=r.meta,
        **fields,
    )


def cpu_workers(cfg, device: torch.device, backend) -> int:
    """How many batches run at once (workers.py): `embedding.cpu_workers`, else one per torch
    thread, for encoders on a CPU; a decoder's paged prefill owns one cache, so it runs alone."""
    if device.type != "cpu" or not getattr(backend, "thread_safe", False):
        return 1
    return cfg.embedding.cpu_workers or torch.get_num_threads()


def is_decoder(hf_model) -> bool:
    """A causal LM (its hidden states come from the paged model), not an encoder."""
    return hasattr(hf_model, "lm_head") or bool(getattr(hf_model.config, "is_decoder", False))
