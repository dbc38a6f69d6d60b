"""Continuous batching: which sequences compute which tokens in the next step.

Each step spends a token budget (`max_batch_tokens`) over at most `max_num_seqs` sequences:
running sequences first (one decode token each, or the next chunk of a long prompt), then
waiting sequences are admitted, highest priority and oldest first, while KV blocks and budget
remain. A long prompt is prefilled in chunks mixed with the other rows' decode tokens. A row
takes, after its cached head, the full blocks that rows before it compute whole in the same
step (sched/step_blocks.py): a head shared by rows admitted together is computed once.

With `speculative_tokens` k > 0, a greedy row that is generating (and whose logits processors
allow drafts) also computes up to k draft
tokens (sched/draft.py) when its own tokens predict them and its blocks have room without
preempting anyone; the runner keeps the drafts the model agrees with, plus its own next token.

When the KV cache runs out, the running sequence with the lowest priority (newest among
equals) is preempted: its blocks are freed and it waits to be recomputed from its tokens.
`running` is kept sorted by (priority desc, arrival), so victims come from its tail and are
never rows already scheduled in the same step.
"""

from __future__ import annotations

import bisect
import heapq

from jobrunner.sched.batch import ScheduledBatch
from jobrunner.sched.block_manager import BlockManager
from jobrunner.sched.draft import NgramDrafter
from jobrunner.sched.sequence import Sequence, SequenceStatus
from jobrunner.sched.step_blocks import StepBlocks
from jobrunner.types import FinishReason


def _rank(seq: Sequence) -> tuple[int, int]:
    return (-seq.priority, seq.seq_id)


class Scheduler:
    def __init__(
        self,
        block_manager: BlockManager,
        max_num_seqs: int,
        max_batch_tokens: int,
        max_model_len: int,
        watermark_blocks: int = 0,
        speculative_tokens: int = 0,
    ):
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_batch_tokens = max_batch_tokens
        self.max_model_len = max_model_len
        self.watermark_blocks = watermark_blocks  # kept free at admission to delay preemption
        self.speculative_tokens = speculative_tokens  # most draft tokens a row computes a step
        self.waiting: list[tuple[int, int, Sequence]] = []  # heap by (-priority, seq_id)
        self.running: list[Sequence] = []  # sorted by _rank
        self.num_preemptions = 0
        self.num_cached_tokens = 0  # prompt tokens served by the prefix cache at first admission

    # ------------------------------------------------------------------ queues

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        heapq.heappush(self.waiting, (*_rank(seq), seq))

    # ------------------------------------------------------------------ schedule

    def schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch()
        bm = self.block_manager
        step = StepBlocks(bm.block_size, bm.enable_prefix_caching)
        budget = self._schedule_running(batch, self.max_batch_tokens, step)
        if not batch.preempted:
            self._admit_waiting(batch, budget, step)
        return batch

    def _schedule_running(self, batch: ScheduledBatch, budget: int, step: StepBlocks) -> int:
        i = 0
        while i < len(self.running) and budget > 0 and len(batch) < self.max_num_seqs:
            seq = self.running[i]
            n = min(seq.num_uncomputed_tokens, budget)
            draft = self._draft(seq, budget - n) if seq.num_uncomputed_tokens == 1 else []
            if draft and not self.block_manager.append_slots(seq, 1 + len(draft)):
                draft = []  # drafts never preempt: this row decodes one token
            if self._make_room(seq, n + len(draft), batch):
                batch.add(seq, n + len(draft), draft)
                if n > 1 and self.waiting:  # a chunk a row admitted next may share
                    step.note_running(seq, n)
                budget -= n + len(draft)
                i += 1
        return budget

    def _draft(self, seq: Sequence, room: int) -> list[int]:
        """Draft tokens for a greedy generating row, none past its token or length limits."""
        if not (self.speculative_tokens and seq.num_output_tokens and seq.request.sampling.greedy):
            return []
        if seq.sampler is not None and not seq.sampler.allows_drafts:
            # a logits processor of the row reads its history (penalties), or would have to
            # check each draft token (a grammar: constrained rows decode one token a step)
            return []
        k = min(
            self.speculative_tokens,
            room,
            seq.max_new_tokens - seq.num_output_tokens - 1,
            self.max_model_len - seq.num_tokens - 1,
        )
        if seq.drafter is None:
            seq.drafter = NgramDrafter()
        return seq.drafter.propose(seq.token_ids, k)

    def _make_room(self, seq: Sequence, n: int, batch: ScheduledBatch) -> bool:
        """Allocate n slots for seq, preempting from the tail; False if seq itself was preempted."""
        while not self.block_manager.append_slots(seq, n):
            victim = self.running[-1]
            self._preempt(victim)
            batch.preempted.append(victim)
            if victim is seq:
                return False
        return True

    def _preempt(self, seq: Sequence, counted: bool = True) -> None:
        self.running.remove(seq)
        self.block_manager.free(seq)
        self.num_preemptions += counted
        self.add(seq)

    def _admit_waiting(self, batch: ScheduledBatch, budget: int, step: StepBlocks) -> None:
        """Admit in queue order. A sequence takes, after its cached head, the full blocks that
        rows before it compute whole in this very step (`step`, sched/step_blocks.py)."""
        bm = self.block_manager
        while self.waiting and budget > 0 and len(batch) < self.max_num_seqs:
            seq = self.waiting[0][2]
            if seq.is_finished:  # aborted while waiting
                heapq.heappop(self.waiting)
                continue
            hits = bm.cached_prefix(seq)
            parent = bm.block_hash[hits[-1]] if hits else None
            shared = step.take(seq, parent, len(hits))
            partial = None if shared else bm.cached_partial(seq, hits)
            head = (len(hits) + len(shared)) * bm.block_size + (partial[1] if partial else 0)
            n = min(seq.num_tokens - head, budget)
            need = bm.num_blocks_to_admit(hits, head + n, len(shared))
            if need + self.watermark_blocks > bm.num_free_blocks and (
                self.running or need > bm.num_free_blocks
            ):
                break
            heapq.heappop(self.waiting)
            self._admit(seq, hits, n, partial, shared, batch)
            batch.add(seq, n)
            budget -= n
            step.note(seq, shared[-1][1] if shared else parent, len(hits) + len(shared), head + n)

    def _admit(
        self,
        seq: Sequence,
        hits: list[int],
        n: int,
        partial: tuple[int, int] | None,
        shared: list[tuple[int, int]],
        batch: ScheduledBatch,
    ) -> None:
        """Give seq its cached head, the blocks it shares with rows admitted before it in this
        step, and blocks for n more tokens. A partial hit's tokens are copied before the step
        runs: its source, a cached block with no reference, may be reused by a later admission
        of this step, but every copy of the step reads its source before any step writes it
        (ModelRunner.copy_heads)."""
        self.block_manager.take_prefix(seq, hits, partial[1] if partial else 0, shared)
        ok = self.block_manager.append_slots(seq, n)
        assert ok, "admission checked the free blocks"
        if partial:
            batch.copies.append((partial[0], seq.block_table[len(hits)], partial[1]))
        if partial or shared:
            batch.heads_in_step.append(seq)
        if not seq.admitted:
            seq.admitted = True
            seq.num_cached_tokens = seq.num_computed_tokens
            self.num_cached_tokens += seq.num_cached_tokens
        seq.status = SequenceStatus.RUNNING
        bisect.insort(self.running, seq, key=_rank)

    def abandon(self, batch: ScheduledBatch) -> None:
        """A step that did not run (out of memory, stopped), its copies perhaps not made: the
        rows whose head it was to fill in hold it unwritten, so they go back to waiting and
        start again."""
        for seq in batch.heads_in_step:
            if seq.status is SequenceStatus.RUNNING:
                self._preempt(seq, counted=False)  # not for want of blocks

    # ------------------------------------------------------------------ after the step

    def postprocess(
        self, batch: ScheduledBatch, token_ids: list[list[int] | None]
    ) -> list[Sequence]:
        """Advance each row by its computed tokens and append the tokens it kept (None for rows
        still mid-prompt), each checked for a stop. Returns the sequences that finished."""
        finished = []
        for seq, n, kept in zip(batch.seqs, batch.num_new_tokens, token_ids, strict=True):
            if seq.is_finished:  # failed or aborted during the step
                continue
            if kept is None:
                seq.num_computed_tokens += n
                self.block_manager.cache_full_blocks(seq)
                continue
            reason = None
            for token_id in kept:
                seq.append_token(token_id)
                reason = seq.check_stop(self.max_model_len)
                if reason is not None:
                    break
            # the KV of every kept token but the newest is computed (a kept draft token had
            # the same input as the model's choice); rejected drafts' slots get rewritten
            seq.num_computed_tokens = seq.num_tokens - 1
            self.block_manager.cache_full_blocks(seq)
            if reason is not None:
                self.finish(seq, reason)
                finished.append(seq)
        return finished

    def finish(self, seq: Sequence, reason: FinishReason, error_code: str | None = None) -> None:
        """End a sequence now (done, failed or aborted) and free its blocks."""
        if seq.is_finished:
            return
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
            self.block_manager.free(seq)
        seq.finish(reason, error_code)  # a waiting one is dropped when it reaches the heap top
