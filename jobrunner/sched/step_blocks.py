"""Full KV blocks that rows of a step compute whole in it, for the rows admitted after them.

Within each layer a step writes every row's new K/V before any row attends, so a row may attend
to a block that another row of the same step computes whole: it takes that block as it would
take a cached head (a reference and the block's chained hash) and computes only what follows,
where it would otherwise compute the same block again or wait a step for it. A block a row
computes only in part (its chunk ends in it) is not shared. If the step does not run, the rows
that took such blocks go back to waiting (Scheduler.abandon).
"""

from __future__ import annotations

from jobrunner.sched.block_manager import chained_blocks
from jobrunner.sched.sequence import Sequence


class StepBlocks:
    def __init__(self, block_size: int, enabled: bool = True) -> None:
        self.block_size = block_size
        self.enabled = enabled  # the prefix cache's switch: off, no row shares a block
        self.whole: dict[int, tuple[int, tuple[int, ...]]] = {}  # hash -> (block id, tokens)

    def note_running(self, seq: Sequence, n: int) -> None:
        """A running row computes its next n known tokens in this step (a prompt's next
        chunk)."""
        first = len(seq.block_hashes)  # its full, computed blocks have their hashes
        if first == seq.num_computed_tokens // self.block_size:
            parent = seq.block_hashes[-1] if first else None
            self.note(seq, parent, first, seq.num_computed_tokens + n)

    def note(self, seq: Sequence, parent: int | None, first: int, end: int) -> None:
        """seq computes its tokens before position `end` in this step, from its block `first`
        on (after the head whose chained hash is `parent`)."""
        bs = self.block_size
        if not self.enabled:
            return
        for j, tokens, h in chained_blocks(
            seq.token_ids, bs, parent, first, min(seq.num_tokens, end) // bs
        ):
            self.whole.setdefault(h, (seq.block_table[j], tokens))

    def take(self, seq: Sequence, parent: int | None, first: int) -> list[tuple[int, int]]:
        """(block id, hash) of each block from seq's block `first` on that rows before it
        compute whole in this step, in order, at least one token left to compute."""
        bs, shared = self.block_size, []
        if not self.whole:
            return shared
        for _, tokens, h in chained_blocks(
            seq.token_ids, bs, parent, first, (seq.num_tokens - 1) // bs
        ):
            got = self.whole.get(h)
            if got is None or got[1] != tokens:
                break
            shared.append((got[0], h))
        return shared
