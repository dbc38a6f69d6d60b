"""One request's state while the scheduler owns it: tokens, KV blocks, progress."""

from __future__ import annotations

import enum
import itertools
from typing import Any

from jobrunner.sched.draft import NgramDrafter
from jobrunner.types import FinishReason, Request, Usage


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


_ids = itertools.count()


class Sequence:
    """A request being generated.

    Invariants: `token_ids` is the prompt followed by the generated tokens; the first
    `num_computed_tokens` of them have their KV in `block_table` (append-only while running,
    emptied on preemption, when the sequence is recomputed from scratch).
    """

    def __init__(self, request: Request, max_new_tokens: int, eos_token_ids: frozenset[int]):
        self.seq_id = next(_ids)  # arrival order; ties in priority go to the older sequence
        self.request = request
        self.token_ids: list[int] = list(request.prompt_token_ids)
        self.num_prompt_tokens = len(self.token_ids)
        self.max_new_tokens = max_new_tokens
        self.stop_token_ids = request.sampling.end_ids(eos_token_ids)
        self.block_table: list[int] = []
        self.block_hashes: list[int] = []  # chained hashes of the full, computed blocks
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0  # prompt tokens served by the prefix cache (first admission)
        self.status = SequenceStatus.WAITING
        self.finish_reason: FinishReason | None = None
        self.error_code: str | None = None
        self.admitted = False
        self.drafter: NgramDrafter | None = None  # speculative decoding, made on first use
        self.work = Usage()  # what the engine computed for this row, and its step time
        # the engine's per-row sampling state (engine/sampler.RowSampler: logits processors,
        # generator, logprobs), made at intake and kept across preemption and recompute
        self.sampler: Any = None

    def __repr__(self) -> str:
        return f"Sequence({self.seq_id}, {self.status.value}, {self.num_computed_tokens}/{self.num_tokens})"

    @property
    def priority(self) -> int:
        return self.request.priority

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)

    def finish(self, reason: FinishReason, error_code: str | None = None) -> None:
        self.status = SequenceStatus.FINISHED
        self.finish_reason = reason
        self.error_code = error_code

    def check_stop(self, max_model_len: int) -> FinishReason | None:
        """Why the sequence is done after its last token, or None to go on."""
        if self.num_output_tokens and self.token_ids[-1] in self.stop_token_ids:
            return FinishReason.STOP
        if self.num_output_tokens >= self.max_new_tokens or self.num_tokens >= max_model_len:
            return FinishReason.LENGTH
        return None
