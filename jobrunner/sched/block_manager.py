"""KV-cache blocks: allocation, reference counts and the prefix cache.

A full block is named by a hash chained over its tokens and every token before it, so two
sequences that share a prompt head share the blocks of that head. Past the last shared full
block, a head that goes on into part of a block is served too (`cached_partial`): the cached
block after the same head whose tokens begin the same way is found among the recent children
of that head (at most CHILDREN_KEPT), and its first tokens' K/V are copied into the
sequence's own new block (ScheduledBatch.copies), so rows whose shared head ends mid-block (a
chat template, a fixed instruction) compute none of it. A block whose reference
count drops to zero keeps its KV and its hash ("evictable") until the space is needed; the
least recently freed evictable block is evicted first. Blocks that hold nothing worth keeping
are reused before any cached block, the most recently freed first (its memory is likely still
in the CPU's caches); then blocks never handed out, in id order, while no more than
`retain_blocks` cached blocks wait unused; past that, the least recently used of those is reused
first. So the part of the cache ever touched, blocks 0..high_water-1, grows to what the live
rows need plus retain_blocks, not to the whole cache: on CPU every page of the cache is mapped
at its first write, which cost a 512-row job on a KVM guest 4 of its 8.8 s of system time
(docs/performance.md).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator

from jobrunner.sched.sequence import Sequence

# cached blocks indexed under each head (their chain parent) for partial hits, newest kept
CHILDREN_KEPT = 32


def min_partial(block_size: int) -> int:
    """Fewest tokens a partial hit serves (a quarter block): below that they are computed, as
    a copy costs a few small operations a layer per step, which a token or two does not repay
    (nor does a shared BOS token alone)."""
    return max(1, block_size // 4)


def chain_hash(parent: int | None, tokens: tuple[int, ...]) -> int:
    return hash((parent, tokens))


def chained_blocks(
    token_ids: list[int], bs: int, parent: int | None, first: int, end: int
) -> Iterator[tuple[int, tuple[int, ...], int]]:
    """(j, tokens, chained hash) of the full blocks first..end-1 of `token_ids`, the chain
    starting from the head whose hash is `parent`."""
    for j in range(first, end):
        tokens = tuple(token_ids[j * bs : (j + 1) * bs])
        parent = chain_hash(parent, tokens)
        yield j, tokens, parent


def common_length(a: tuple[int, ...], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):  # as far as the shorter goes
        if x != y:
            break
        n += 1
    return n


class BlockManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool = True,
        retain_blocks: int | None = None,
    ):
        self.num_blocks = num_blocks
        # cached blocks of finished rows kept while untouched blocks remain; beyond this many,
        # the least recently used is reused first (None: keep them all)
        self.retain_blocks = num_blocks if retain_blocks is None else retain_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_counts = [0] * num_blocks
        self.block_hash: list[int | None] = [None] * num_blocks
        self.block_tokens: list[tuple[int, ...] | None] = [None] * num_blocks
        self.hash_to_block: dict[int, int] = {}
        # chain parent (None: the first block) -> cached blocks after it, oldest first
        self.children: dict[int | None, list[int]] = {}
        self.block_parent: list[int | None] = [None] * num_blocks  # of named blocks
        self.recycled: list[int] = []  # freed, holding nothing worth keeping: reused first
        self.high_water = 0  # blocks high_water.. were never handed out
        self.evictable: OrderedDict[int, None] = OrderedDict()  # ref 0, cached; LRU first
        self.num_hits = 0  # prefix-cache blocks reused
        self.num_partial_tokens = 0  # tokens copied from cached blocks' heads (partial hits)
        self.num_evictions = 0

    # ------------------------------------------------------------------ sizes

    @property
    def num_free_blocks(self) -> int:
        return len(self.recycled) + self.num_blocks - self.high_water + len(self.evictable)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # ------------------------------------------------------------------ prefix cache

    def cached_prefix(self, seq: Sequence) -> list[int]:
        """Cached block ids for the head of `seq` (no side effects).

        At least one token is always left to compute: its logits give the next token.
        """
        if not self.enable_prefix_caching:
            return []
        bs, hits = self.block_size, []
        for _, tokens, h in chained_blocks(seq.token_ids, bs, None, 0, (seq.num_tokens - 1) // bs):
            block_id = self.hash_to_block.get(h)
            if block_id is None or self.block_tokens[block_id] != tokens:
                break
            hits.append(block_id)
        return hits

    def cached_partial(self, seq: Sequence, hits: list[int]) -> tuple[int, int] | None:
        """(cached block, n): the block after the head `hits` whose first n tokens are the
        sequence's next n, n as large as any recent such block offers, below a block and
        leaving at least one token to compute; None where no block begins with min_partial
        of them."""
        if not self.enable_prefix_caching:
            return None
        bs, start = self.block_size, len(hits) * self.block_size
        room = min(bs - 1, seq.num_tokens - 1 - start)
        if room <= 0:
            return None
        parent = self.block_hash[hits[-1]] if hits else None
        want, best, best_n = seq.token_ids[start : start + room], None, 0
        for block_id in self.children.get(parent, ()):
            n = common_length(self.block_tokens[block_id], want)
            if n > best_n:
                best, best_n = block_id, n
        return None if best_n < min_partial(bs) else (best, best_n)

    def num_blocks_to_admit(self, hits: list[int], num_tokens: int, shared: int = 0) -> int:
        """Free blocks that admitting with `hits` (and `shared` blocks another row holds) and
        `num_tokens` tokens in all would use."""
        revived = sum(1 for b in hits if self.ref_counts[b] == 0)
        return self.blocks_for(num_tokens) - len(hits) - shared + revived

    def take_prefix(
        self,
        seq: Sequence,
        hits: list[int],
        partial: int = 0,
        shared: list[tuple[int, int]] | None = None,
    ) -> None:
        """Give an empty sequence the cached head blocks `hits` (from cached_prefix), then the
        blocks `shared` ((block id, chained hash) each: blocks another row computes in this
        step, sched/step_blocks.py), and count `partial` more tokens computed: the caller has
        them copied into the block after the head (cached_partial) before any step reads them."""
        assert not seq.block_table, "take_prefix needs a sequence without blocks"
        held = hits + [b for b, _ in shared or ()]
        for block_id in held:
            if self.ref_counts[block_id] == 0:
                del self.evictable[block_id]
            self.ref_counts[block_id] += 1
            seq.block_table.append(block_id)
        # the shared blocks are named after the step by whichever of their rows gets there
        # first (cache_full_blocks): the row computing them may fail in it
        seq.block_hashes.extend(self.block_hash[b] for b in hits)
        self.num_hits += len(hits)
        self.num_partial_tokens += partial
        seq.num_computed_tokens = len(held) * self.block_size + partial

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block while no sequence holds one: they become free blocks that
        are reused first (their memory stays mapped), and no later row hits them. False, and
        no change, while any block is in use."""
        if any(self.ref_counts):
            return False
        self.recycled.extend(self.evictable)  # the most recently freed is reused first
        self.evictable.clear()
        self.hash_to_block.clear()
        self.children.clear()
        self.block_hash = [None] * self.num_blocks
        self.block_tokens = [None] * self.num_blocks
        return True

    # ------------------------------------------------------------------ allocation

    def append_slots(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Grow the block table to hold `num_new_tokens` more tokens; False (and no change)
        when there are not enough free blocks."""
        need = self.blocks_for(seq.num_computed_tokens + num_new_tokens) - len(seq.block_table)
        if need > self.num_free_blocks:
            return False
        for _ in range(need):
            seq.block_table.append(self._pop_free())
        return True

    def _pop_free(self) -> int:
        if self.recycled:
            block_id = self.recycled.pop()
        elif self.high_water < self.num_blocks and len(self.evictable) <= self.retain_blocks:
            block_id = self.high_water
            self.high_water += 1
        else:
            block_id, _ = self.evictable.popitem(last=False)
            self._forget(block_id)
            self.num_evictions += 1
        self.ref_counts[block_id] = 1
        return block_id

    def cache_full_blocks(self, seq: Sequence) -> None:
        """Name the blocks that became full and computed, so later sequences can share them."""
        if not self.enable_prefix_caching:
            return
        bs, first = self.block_size, len(seq.block_hashes)
        parent = seq.block_hashes[-1] if first else None
        for i, tokens, h in chained_blocks(
            seq.token_ids, bs, parent, first, seq.num_computed_tokens // bs
        ):
            seq.block_hashes.append(h)
            block_id = seq.block_table[i]
            if h not in self.hash_to_block and self.block_hash[block_id] is None:
                self._name(block_id, h, parent, tokens)
            parent = h

    def _name(self, block_id: int, h: int, parent: int | None, tokens: tuple[int, ...]) -> None:
        self.hash_to_block[h] = block_id
        self.block_hash[block_id] = h
        self.block_tokens[block_id] = tokens
        self.block_parent[block_id] = parent
        kids = self.children.setdefault(parent, [])
        kids.append(block_id)
        if len(kids) > CHILDREN_KEPT:
            del kids[0]

    def _forget(self, block_id: int) -> None:
        """An evicted block's name and its place among its parent's children."""
        del self.hash_to_block[self.block_hash[block_id]]
        parent = self.block_parent[block_id]
        kids = self.children.get(parent, [])
        if block_id in kids:
            kids.remove(block_id)
            if not kids:
                del self.children[parent]
        self.block_hash[block_id] = self.block_tokens[block_id] = self.block_parent[block_id] = None

    def free(self, seq: Sequence) -> None:
        """Drop the sequence's references, tail first, so that shared heads are evicted last."""
        for block_id in reversed(seq.block_table):
            self.ref_counts[block_id] -= 1
            if self.ref_counts[block_id] == 0:
                if self.block_hash[block_id] is None:
                    self.recycled.append(block_id)
                else:
                    self.evictable[block_id] = None
        seq.block_table = []
        seq.block_hashes = []
        seq.num_computed_tokens = 0
