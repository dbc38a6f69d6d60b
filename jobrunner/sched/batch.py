"""What the scheduler hands the model runner for one step: plain data, no tensors."""

from __future__ import annotations

from dataclasses import dataclass, field

from jobrunner.sched.sequence import Sequence


@dataclass
class ScheduledBatch:
    """One forward step. Row i computes tokens
    `seqs[i].token_ids[start_positions[i] : start_positions[i] + num_new_tokens[i]]`,
    whose KV goes to the slots named by `seqs[i].block_table` (already allocated)."""

    seqs: list[Sequence] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)
    start_positions: list[int] = field(default_factory=list)  # num_computed_tokens at schedule
    preempted: list[Sequence] = field(default_factory=list)  # sent back to waiting this step

    def add(self, seq: Sequence, num_new_tokens: int) -> None:
        self.seqs.append(seq)
        self.num_new_tokens.append(num_new_tokens)
        self.start_positions.append(seq.num_computed_tokens)

    def __len__(self) -> int:
        return len(self.seqs)

    @property
    def num_tokens(self) -> int:
        return sum(self.num_new_tokens)

    def is_decode(self, i: int) -> bool:
        """One new token that is the sequence's last: a decode row (or a 1-token prefill tail)."""
        return self.num_new_tokens[i] == 1 and self.samples(i)

    def samples(self, i: int) -> bool:
        """The row reaches the end of its sequence, so its last position yields a token."""
        return self.start_positions[i] + self.num_new_tokens[i] == self.seqs[i].num_tokens

    @property
    def num_decode_tokens(self) -> int:
        return sum(
            1 for i in range(len(self.seqs)) if self.seqs[i].num_output_tokens and self.is_decode(i)
        )

    @property
    def num_prefill_tokens(self) -> int:
        return self.num_tokens - self.num_decode_tokens
