"""What the scheduler hands the model runner for one step: plain data, no tensors."""

from __future__ import annotations

from dataclasses import dataclass, field

from jobrunner.sched.sequence import Sequence


@dataclass
class ScheduledBatch:
    """One forward step. Row i computes the `num_new_tokens[i]` tokens `input_tokens(i)` from
    position `start_positions[i]`, whose KV goes to the slots named by `seqs[i].block_table`
    (already allocated): the sequence's own tokens, then the row's draft tokens, if any
    (speculative decoding: the row samples at each of its last 1 + len(draft) positions)."""

    seqs: list[Sequence] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)
    start_positions: list[int] = field(default_factory=list)  # num_computed_tokens at schedule
    drafts: list[list[int]] = field(default_factory=list)  # proposed tokens after the known ones
    preempted: list[Sequence] = field(default_factory=list)  # sent back to waiting this step
    # (source block, destination block, n): partial prefix hits, the first n tokens' K/V of a
    # cached block copied into a row's own block before the step runs (BlockManager)
    copies: list[tuple[int, int, int]] = field(default_factory=list)
    # rows whose head this step fills in: a partial hit's copied tokens, or blocks other rows
    # compute in it (sched/step_blocks.py); they go back to waiting if the step does not run
    # (Scheduler.abandon)
    heads_in_step: list[Sequence] = field(default_factory=list)

    def add(self, seq: Sequence, num_new_tokens: int, draft: list[int] | None = None) -> None:
        self.seqs.append(seq)
        self.num_new_tokens.append(num_new_tokens)
        self.start_positions.append(seq.num_computed_tokens)
        self.drafts.append(draft or [])

    def known_end(self, i: int) -> int:
        """The position after the row's last known (non-draft) token."""
        return self.start_positions[i] + self.num_new_tokens[i] - len(self.drafts[i])

    def input_tokens(self, i: int) -> list[int]:
        return self.seqs[i].token_ids[self.start_positions[i] : self.known_end(i)] + self.drafts[i]

    def __len__(self) -> int:
        return len(self.seqs)

    @property
    def num_tokens(self) -> int:
        return sum(self.num_new_tokens)

    def is_decode(self, i: int) -> bool:
        """One new token that is the sequence's last: a decode row (or a 1-token prefill tail)."""
        return self.num_new_tokens[i] == 1 and self.samples(i)

    def samples(self, i: int) -> bool:
        """The row reaches the end of its known tokens, so its last known token's position
        yields a token (and each of its draft tokens' positions one more)."""
        return self.known_end(i) == self.seqs[i].num_tokens

    @property
    def num_decode_tokens(self) -> int:
        """Tokens of rows that are generating (one each, or one plus their drafts)."""
        return sum(
            self.num_new_tokens[i]
            for i in range(len(self.seqs))
            if self.seqs[i].num_output_tokens
            and self.samples(i)
            and self.known_end(i) - self.start_positions[i] == 1
        )

    @property
    def num_prefill_tokens(self) -> int:
        return self.num_tokens - self.num_decode_tokens

    @property
    def num_prefill_context_tokens(self) -> int:
        """Over the prompt tokens computed in this step, the context each attends to (every
        earlier token and itself): what prefill attention reads, quadratic in a chunk's length."""
        total = 0
        for i, seq in enumerate(self.seqs):
            s, n = self.start_positions[i], self.num_new_tokens[i]
            if s < seq.num_prompt_tokens:
                total += n * s + n * (n + 1) // 2
        return total
