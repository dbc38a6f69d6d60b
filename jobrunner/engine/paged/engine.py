"""The paged engine: continuous batching over a paged KV cache with a prefix cache.

Each step reads like a sentence: schedule -> run -> postprocess; detokenization and stop
strings run behind it in a thread (detok.py).

Fault injection (for crash-safety tests): `JOBRUNNER_FAULT_OOM_STEPS="3,4"` makes forward
attempts number 3 and 4 (1-based, counting retries) raise `torch.OutOfMemoryError`, which
exercises the back-off path: the step is dropped, max_num_seqs and the token budget are
halved, the same sequences are scheduled again and `stats.oom_retries` grows; a single
sequence that still fails ends with error_code "oom". After GROW_BACK_STEPS clean steps the
limits double back towards the configured ones (a transient squeeze does not halve the rest of a
long job); each OOM after such a recovery doubles the wait before the next one.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable, Iterator

import torch

from jobrunner.engine.base import Engine, model_context
from jobrunner.engine.finish import error_result
from jobrunner.engine.paged.detok import Detokenizer, FinishedRow
from jobrunner.engine.paged.kv_cache import kv_cache_for
from jobrunner.engine.paged.model import PagedCausalLM, StepInterrupted, unsupported_reason
from jobrunner.engine.paged.runner import ModelRunner
from jobrunner.engine.sampler import RowSampler
from jobrunner.sched import BlockManager, ScheduledBatch, Scheduler, Sequence
from jobrunner.types import FinishReason, Request, Result, SamplingParams

log = logging.getLogger(__name__)

FAULT_ENV = "JOBRUNNER_FAULT_OOM_STEPS"
MIN_BATCH_TOKENS = 16
GROW_BACK_STEPS = 64  # clean steps after an OOM before the limits double back (x2 per relapse)
WARM_UP_TOKENS = 8  # a prompt shorter than a block: the warm-up leaves nothing in the prefix cache


def is_oom(e: BaseException) -> bool:
    """torch's out-of-memory errors, and a native kernel's failed allocation (MemoryError)."""
    return isinstance(e, (torch.OutOfMemoryError, MemoryError)) or (
        isinstance(e, RuntimeError) and "out of memory" in str(e)
    )


class PagedEngine(Engine):
    """`generate(requests)` pulls requests lazily (the waiting queue holds at most about
    2 x max_num_seqs) and yields each row's Result as soon as its text is final."""

    kind = "paged"

    @classmethod
    def supports(cls, loaded, cfg) -> str | None:
        """A sliding window counts where rows can outgrow it: the job's context, as the
        engine caps it (a Mistral v0.1's 4096-token window never slides in 2048 tokens)."""
        return unsupported_reason(loaded.model, model_context(loaded, cfg))

    def __init__(self, loaded, cfg) -> None:
        super().__init__(loaded, cfg)
        e = cfg.engine
        if e.num_threads and loaded.device.type == "cpu":
            torch.set_num_threads(e.num_threads)
        self.max_model_len = model_context(loaded, cfg)
        self.model = PagedCausalLM(loaded.model, self.max_model_len)
        # a stop abandons a long step between layers (model.StepInterrupted)
        self.model.stopping = lambda: self.stop_requested
        self.kv = kv_cache_for(self.model, cfg, loaded.dtype, loaded.device, self.max_model_len)
        self.block_manager = BlockManager(
            self.kv.num_blocks,
            e.block_size,
            e.prefix_caching,
            retain_blocks=self.kv.retain_blocks(loaded.device),
        )
        self.batch_tokens = e.batch_tokens(loaded.device.type)
        self.scheduler = Scheduler(
            self.block_manager,
            e.max_num_seqs,
            self.batch_tokens,
            self.max_model_len,
            watermark_blocks=max(1, self.kv.num_blocks // 100),
            speculative_tokens=e.speculative_tokens,
        )
        graph_rows = e.max_num_seqs if e.cuda_graphs else 0
        self.runner = ModelRunner(
            self.model, self.kv, loaded.device, graph_rows, self.max_model_len
        )
        self.eos_token_ids = frozenset(loaded.eos_token_ids)
        self.stats.num_kv_blocks = self.kv.num_blocks
        self.stats.kv_bytes_per_token = self.kv.bytes_per_token
        self._fault_steps = {int(s) for s in os.environ.get(FAULT_ENV, "").split(",") if s.strip()}
        self._attempts = 0
        self._clean_steps = 0
        self._grow_after = GROW_BACK_STEPS
        self._live: dict[int, Sequence] = {}
        self._entered: dict[int, float] = {}  # seq_id -> when it entered the engine (latency)

    def warm_up(self) -> None:
        """Two tiny requests through a prefill and a decode step, then fresh stats: the lazy
        one-off work of the first steps (packing weights, starting kernels and thread pools)
        is load time, spread over every row, not the first rows' own step time, and it stays
        out of the steps the device profile fits."""
        sampling = SamplingParams(max_new_tokens=2, ignore_eos=True)
        rows = [Request(f"warm-up {i}", [0] * WARM_UP_TOKENS, sampling) for i in range(2)]
        for _ in self.run_samples(iter(rows)):
            pass
        self.reset_prefix_cache()  # the warm-up's blocks hold no row's prompt
        self.reset_stats()
        self._attempts = self._clean_steps = 0

    def reset_prefix_cache(self) -> bool:
        """Forget the prompt heads cached so far (BlockManager.reset_prefix_cache): False while
        rows are in flight."""
        return self.block_manager.reset_prefix_cache()

    # ------------------------------------------------------------------ the loop

    def run_samples(self, requests: Iterable[Request]) -> Iterator[Result]:
        self._t0 = time.perf_counter()
        self.detok = Detokenizer(self.loaded.tokenizer)
        pending = iter(requests)
        try:
            while not self._stop_requested:
                pending = self._top_up(pending)
                if not self.scheduler.has_work():
                    break
                self.step()
                self._abort_stop_hits()
                yield from self.detok.drain()
        finally:
            last = self.detok.close()
            self.stats.engine_seconds += time.perf_counter() - self._t0
        yield from last

    def step(self) -> None:
        t = time.perf_counter()
        batch = self.scheduler.schedule()
        if not len(batch):
            self._fail_unschedulable()
            return
        out = self._run(batch)
        if out is None:
            self.scheduler.abandon(batch)
        else:
            tokens, finite = out
            self._grow_back()
            self._fail_rows(batch, finite)
            self._record(batch, time.perf_counter() - t)
            self._emit_step(batch, tokens, self.scheduler.postprocess(batch, tokens))

    # ------------------------------------------------------------------ intake

    def _top_up(self, pending: Iterator[Request] | None) -> Iterator[Request] | None:
        """Pull requests until the waiting queue holds 2 x max_num_seqs; None once exhausted."""
        while pending is not None and self.scheduler.num_waiting < 2 * self.cfg.engine.max_num_seqs:
            request = next(pending, None)
            if request is None:
                return None
            self._add(request)
        return pending

    def _add(self, request: Request) -> None:
        n = request.num_prompt_tokens
        cache = self.kv.num_blocks * self.kv.block_size
        capacity = min(self.max_model_len, cache)
        if n == 0 or n >= capacity:
            limit = (
                f"the model's context, {capacity} tokens"
                if capacity == self.max_model_len
                else f"the KV cache holds {cache} tokens: raise engine.kv_cache_bytes"
            )
            why = "empty prompt" if n == 0 else f"{n} prompt tokens leave no room ({limit})"
            self._reject(request, "prompt_too_long" if n else "empty_prompt", why)
            return
        max_new = min(request.sampling.max_new_tokens, capacity - n)
        seq = Sequence(request, max_new, self.eos_token_ids)
        seq.sampler = RowSampler.for_request(request, self.loaded.device, self.eos_token_ids)
        spec = request.sampling.structured
        if spec is not None:
            try:  # compiled already by the prep stage unless this engine runs without one
                seq.sampler.add(self.grammars.processor(spec))
            except ValueError as e:  # GrammarError: the spec does not compile
                self._reject(request, "bad_schema", str(e))
                return
        self._live[seq.seq_id] = seq
        self._entered[seq.seq_id] = time.perf_counter()
        self.detok.watch(seq)
        self.scheduler.add(seq)

    def _reject(self, request: Request, code: str, message: str) -> None:
        self.detok.result(error_result(request, code, message))

    # ------------------------------------------------------------------ forward with back-off

    def _run(self, batch: ScheduledBatch):
        self._attempts += 1
        t = time.perf_counter()
        try:
            if self._attempts in self._fault_steps:
                raise torch.OutOfMemoryError(f"injected by {FAULT_ENV} at attempt {self._attempts}")
            self.runner.copy_heads(batch.copies)  # partial hits' heads, before the step
            return self.runner.run(batch)
        except StepInterrupted as e:
            log.warning("stop requested: step of %d tokens abandoned (%s)", batch.num_tokens, e)
            return None
        except (torch.OutOfMemoryError, MemoryError, RuntimeError) as e:
            if not is_oom(e):
                raise
            self._back_off(batch, e)
            return None
        finally:
            self.stats.forward_seconds += time.perf_counter() - t

    def _back_off(self, batch: ScheduledBatch, e: BaseException) -> None:
        self.stats.oom_retries += 1
        if self._clean_steps >= self._grow_after:  # relapsed after a recovery: wait longer
            self._grow_after *= 2
        self._clean_steps = 0
        if self.loaded.device.type == "cuda":
            torch.cuda.empty_cache()
        s = self.scheduler
        if len(batch) == 1 and batch.num_tokens <= MIN_BATCH_TOKENS:
            log.error("out of memory with one sequence of %d tokens: failing it", batch.num_tokens)
            self._finish(batch.seqs[0], FinishReason.ERROR, "oom", f"out of memory: {e}")
            return
        s.max_num_seqs = max(1, len(batch) // 2)
        s.max_batch_tokens = max(MIN_BATCH_TOKENS, batch.num_tokens // 2)
        log.warning(
            "out of memory; retrying with max_num_seqs=%d max_batch_tokens=%d",
            s.max_num_seqs,
            s.max_batch_tokens,
        )

    def _grow_back(self) -> None:
        """After enough clean steps, double reduced limits back towards the configured ones."""
        s, e = self.scheduler, self.cfg.engine
        if s.max_num_seqs >= e.max_num_seqs and s.max_batch_tokens >= self.batch_tokens:
            return
        self._clean_steps += 1
        if self._clean_steps % self._grow_after:
            return
        s.max_num_seqs = min(e.max_num_seqs, 2 * s.max_num_seqs)
        s.max_batch_tokens = min(self.batch_tokens, 2 * s.max_batch_tokens)
        log.info(
            "no out-of-memory for %d steps; growing back to max_num_seqs=%d max_batch_tokens=%d",
            self._clean_steps,
            s.max_num_seqs,
            s.max_batch_tokens,
        )

    # ------------------------------------------------------------------ finishing

    def _fail_rows(self, batch: ScheduledBatch, finite: list[bool]) -> None:
        for seq, ok in zip(batch.seqs, finite, strict=True):
            if not ok:
                self._finish(
                    seq, FinishReason.ERROR, "nan_logits", "the logits were NaN or infinite"
                )

    def _fail_unschedulable(self) -> None:
        """Nothing fits even in an idle cache: the head of the queue can never run."""
        head = self.scheduler.waiting[0][2]
        self._finish(
            head,
            FinishReason.ERROR,
            "kv_cache_too_small",
            f"{head.num_tokens} tokens do not fit in the KV cache",
        )

    def _finish(
        self, seq: Sequence, reason: FinishReason, code: str | None = None, msg: str | None = None
    ):
        self.scheduler.finish(seq, reason, code)
        self._post_finished(seq, msg)

    def _emit_step(
        self, batch: ScheduledBatch, tokens: list[list[int] | None], finished: list[Sequence]
    ) -> None:
        st, new = self.stats, []
        for i, kept in enumerate(tokens):
            if kept is None:  # mid-prompt
                continue
            seq = batch.seqs[i]
            new.append((seq, seq.token_ids[batch.known_end(i) :]))  # what postprocess appended
            if batch.drafts[i]:
                st.draft_tokens += len(batch.drafts[i])
                st.accepted_draft_tokens += len(kept) - 1
        st.generated_tokens += sum(len(t) for _, t in new)
        self.detok.tokens(
            [(seq.seq_id, t) for seq, ts in new if seq.request.sampling.stop for t in ts]
        )
        for seq in finished:
            self._post_finished(seq)

    def _post_finished(self, seq: Sequence, msg: str | None = None) -> None:
        self._live.pop(seq.seq_id, None)
        self._entered.pop(seq.seq_id, None)
        self.detok.finished(
            FinishedRow(
                seq.seq_id,
                seq.request,
                seq.output_token_ids,
                seq.finish_reason,
                seq.num_cached_tokens,
                seq.error_code,
                msg,
                work=seq.work,
                ends=seq.stop_token_ids,
                logprobs=seq.sampler.logprobs,
                structure=seq.sampler.structure,
            )
        )

    def _abort_stop_hits(self) -> None:
        for seq_id in self.detok.stop_hits():
            seq = self._live.pop(seq_id, None)
            self._entered.pop(seq_id, None)
            if seq is not None:
                self.scheduler.finish(seq, FinishReason.STOP)

    # ------------------------------------------------------------------ telemetry

    def _record(self, batch: ScheduledBatch, seconds: float) -> None:
        s, sched = self.stats, self.scheduler
        decode = batch.num_decode_tokens
        s.steps += 1
        s.row_seconds += seconds
        self._attribute(batch, seconds)
        s.prefill_tokens += batch.num_tokens - decode
        s.decode_tokens += decode
        s.cached_tokens = sched.num_cached_tokens
        s.preemptions = sched.num_preemptions
        s.step_log.append(
            {
                "t": round(time.perf_counter() - self._t0, 4),
                "num_running": sched.num_running,
                "num_waiting": sched.num_waiting,
                "batch_tokens": batch.num_tokens,
                "prefill_tokens": batch.num_tokens - decode,
                "decode_tokens": decode,
                "prefill_context_tokens": batch.num_prefill_context_tokens,
                "kv_blocks_used": self.block_manager.num_used_blocks,
                "step_seconds": round(seconds, 5),
                "preemptions": sched.num_preemptions,
            }
        )

    def _attribute(self, batch: ScheduledBatch, seconds: float) -> None:
        """Share the step's time by the tokens each row computed in it; note first/last tokens."""
        now, total = time.perf_counter(), max(batch.num_tokens, 1)
        for i, seq in enumerate(batch.seqs):
            w, n = seq.work, batch.num_new_tokens[i]
            w.add_step(n, batch.start_positions[i] >= seq.num_prompt_tokens, seconds * n / total)
            if not batch.samples(i):
                continue
            since = now - self._entered.get(seq.seq_id, now)
            if w.first_token_seconds is None:
                w.first_token_seconds = since
            else:
                w.decode_seconds = since - w.first_token_seconds
