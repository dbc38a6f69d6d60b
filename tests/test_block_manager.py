"""Block manager: exact block ids, prefix-cache hits, LRU eviction order."""

from __future__ import annotations

import pytest

from jobrunner.sched import BlockManager, Sequence
from jobrunner.types import Request, SamplingParams


def make_seq(tokens: list[int], rid: str = "r") -> Sequence:
    return Sequence(
        Request(rid, tokens, SamplingParams()), max_new_tokens=8, eos_token_ids=frozenset()
    )


def computed(bm: BlockManager, seq: Sequence, n: int) -> None:
    """Allocate n more tokens, then mark them computed (as a finished step does)."""
    assert bm.append_slots(seq, n)
    seq.num_computed_tokens += n
    bm.cache_full_blocks(seq)


def test_allocation_takes_lowest_free_ids_in_order():
    bm = BlockManager(num_blocks=8, block_size=4)
    a = make_seq(list(range(10)))
    computed(bm, a, 10)
    assert a.block_table == [0, 1, 2]
    assert bm.num_free_blocks == 5
    assert len(a.block_hashes) == 2  # only full blocks are named


def test_append_slots_without_room_changes_nothing():
    bm = BlockManager(num_blocks=2, block_size=4)
    a = make_seq(list(range(12)))
    assert not bm.append_slots(a, 12)
    assert a.block_table == [] and bm.num_free_blocks == 2


def test_shared_head_hits_and_ref_counts():
    bm = BlockManager(num_blocks=8, block_size=4)
    a = make_seq(list(range(10)))
    computed(bm, a, 10)
    b = make_seq(list(range(8)) + [99, 98, 97])
    hits = bm.cached_prefix(b)
    assert hits == [0, 1]
    assert bm.num_blocks_to_admit(hits, 11) == 1  # blocks 0, 1 live: only the tail is new
    bm.take_prefix(b, hits)
    assert b.num_computed_tokens == 8
    assert bm.ref_counts[:2] == [2, 2]
    assert bm.num_hits == 2
    computed(bm, b, 3)
    assert b.block_table == [0, 1, 3]


def test_always_leaves_one_token_to_compute():
    bm = BlockManager(num_blocks=8, block_size=4)
    a = make_seq(list(range(8)))
    computed(bm, a, 8)
    assert bm.cached_prefix(make_seq(list(range(8)))) == [0]  # not [0, 1]
    assert bm.cached_prefix(make_seq(list(range(9)))) == [0, 1]


def test_chained_hash_needs_the_same_head():
    bm = BlockManager(num_blocks=8, block_size=4)
    computed(bm, make_seq([1, 2, 3, 4, 5, 6, 7, 8, 0]), 9)
    # same second block, different first block: no hit at all
    assert bm.cached_prefix(make_seq([9, 9, 9, 9, 5, 6, 7, 8, 0])) == []


def test_eviction_order_is_lru_and_uncached_blocks_go_first():
    bm = BlockManager(num_blocks=6, block_size=4)
    a = make_seq(list(range(10)))
    computed(bm, a, 10)  # blocks 0, 1 named, 2 partial
    b = make_seq(list(range(100, 109)))
    computed(bm, b, 9)  # blocks 3, 4 named, 5 partial
    bm.free(a)  # tail first: 2 -> free list, then 1, 0 -> evictable
    bm.free(b)  # 5 -> free list, then 4, 3 -> evictable
    assert bm.recycled == [2, 5]
    assert list(bm.evictable) == [1, 0, 4, 3]
    c = make_seq(list(range(200, 216)))
    computed(bm, c, 16)
    # unnamed blocks first (the most recently freed first), then the least recently freed
    assert c.block_table == [5, 2, 1, 0]
    assert bm.num_evictions == 2
    assert bm.cached_prefix(make_seq(list(range(10)))) == []  # a's head was evicted
    assert bm.cached_prefix(make_seq(list(range(100, 109)))) == [3, 4]  # b's survived


def test_freed_blocks_are_reused_before_untouched_ones():
    """Rows that come and go reuse the same blocks: the cache's touched part (0..high_water-1,
    each page of it faulted in at its first write on CPU) stays the size of the rows alive at
    once."""
    bm = BlockManager(num_blocks=100, block_size=4, enable_prefix_caching=False)
    for i in range(50):
        s = make_seq(list(range(i, i + 10)))
        computed(bm, s, 10)
        bm.free(s)
    assert bm.high_water == 3
    assert bm.num_free_blocks == 100


def test_cached_blocks_past_the_retained_count_are_reused_before_untouched_ones():
    bm = BlockManager(num_blocks=100, block_size=4, retain_blocks=4)
    for i in range(50):  # distinct prompts: each leaves 2 named blocks behind
        s = make_seq([1000 + i] * 10)
        computed(bm, s, 10)
        bm.free(s)
    assert bm.high_water <= 3 + 4 + 2  # one row's blocks, the retained ones, one row's slack
    assert len(bm.evictable) <= 6
    assert bm.cached_prefix(make_seq([1000 + 49] * 10)) != []  # the latest row's head is kept
    assert bm.cached_prefix(make_seq([1000] * 10)) == []  # the first row's was reused


def test_without_a_retained_count_every_cached_block_is_kept():
    bm = BlockManager(num_blocks=100, block_size=4)
    for i in range(40):
        s = make_seq([1000 + i] * 10)
        computed(bm, s, 10)
        bm.free(s)
    assert len(bm.evictable) == 80
    assert bm.cached_prefix(make_seq([1000] * 10)) != []  # the first row's head survives


def test_hit_on_evictable_block_revives_it():
    bm = BlockManager(num_blocks=4, block_size=4)
    a = make_seq(list(range(9)))
    computed(bm, a, 9)
    bm.free(a)
    b = make_seq(list(range(9)))
    hits = bm.cached_prefix(b)
    assert hits == [0, 1]
    assert bm.num_blocks_to_admit(hits, 9) == 3  # two revived + one new
    bm.take_prefix(b, hits)
    assert list(bm.evictable) == [] and bm.ref_counts[:2] == [1, 1]


@pytest.mark.parametrize("enabled", [False])
def test_prefix_caching_off_never_hits(enabled):
    bm = BlockManager(num_blocks=8, block_size=4, enable_prefix_caching=enabled)
    computed(bm, make_seq(list(range(10))), 10)
    assert bm.cached_prefix(make_seq(list(range(10)))) == []
    assert bm.hash_to_block == {}


def test_sched_imports_no_torch():
    import subprocess
    import sys

    code = "import sys, jobrunner.sched, jobrunner.prep.order; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_reset_prefix_cache_forgets_heads_and_reuses_their_blocks():
    """A reset between two runs of the same rows makes the second compute every prompt again
    (equal work), on the blocks the first run mapped, not on untouched ones."""
    bm = BlockManager(num_blocks=100, block_size=4)
    a = make_seq(list(range(10)))
    computed(bm, a, 10)
    assert not bm.reset_prefix_cache()  # a holds blocks: nothing changes
    assert bm.cached_prefix(make_seq(list(range(10)))) == [0, 1]
    bm.free(a)
    assert bm.reset_prefix_cache()
    b = make_seq(list(range(10)))
    assert bm.cached_prefix(b) == []
    assert bm.num_free_blocks == 100
    computed(bm, b, 10)
    assert sorted(b.block_table) == [0, 1, 2] and bm.high_water == 3


def test_a_head_that_ends_mid_block_is_found_in_a_cached_block():
    bm = BlockManager(num_blocks=16, block_size=4)
    a = make_seq([1, 2, 3, 4, 5, 6, 7, 8, 9])  # blocks [1..4] [5..8] named
    computed(bm, a, 9)
    c = make_seq([1, 2, 3, 4, 5, 9, 9, 9, 9])  # after [1..4], [5, 6, 7, 0] begins like it
    computed(bm, c, 9)
    b = make_seq([1, 2, 3, 4, 5, 6, 7, 0, 0, 0])
    hits = bm.cached_prefix(b)
    assert hits == [0]
    assert bm.cached_partial(b, hits) == (a.block_table[1], 3)  # the longest of the two
    assert bm.num_blocks_to_admit(hits, 10) == 2  # the partial block is b's own
    bm.take_prefix(b, hits, 3)
    assert b.num_computed_tokens == 7 and bm.num_partial_tokens == 3
    # the first block too, and never the token whose logits give the next token
    assert bm.cached_partial(make_seq([1, 2, 3, 7]), []) == (0, 3)
    assert bm.cached_partial(make_seq([1, 2, 3]), []) == (0, 2)
    assert bm.cached_partial(make_seq([1]), []) is None
    assert bm.cached_partial(make_seq([2, 2, 3, 4, 5]), []) is None


def test_a_partial_hit_forgets_evicted_and_reset_blocks():
    bm = BlockManager(num_blocks=3, block_size=4, retain_blocks=0)
    a = make_seq([1, 2, 3, 4, 5, 6, 7, 8])
    computed(bm, a, 8)
    bm.free(a)
    b = make_seq([1, 2, 3, 4, 5, 6, 0, 0])
    assert bm.cached_partial(b, bm.cached_prefix(b)) == (1, 2)
    c = make_seq(list(range(100, 112)))  # takes every block: a's are evicted
    computed(bm, c, 12)
    assert bm.cached_partial(b, bm.cached_prefix(b)) is None
    assert bm.cached_partial(make_seq([100, 101, 7]), []) == (c.block_table[0], 2)
    bm.free(c)
    assert bm.reset_prefix_cache()
    assert bm.cached_partial(make_seq([100, 101, 7]), []) is None


def test_partial_hits_look_among_a_head_s_newest_children_only():
    from jobrunner.sched.block_manager import CHILDREN_KEPT

    bm = BlockManager(num_blocks=4 * CHILDREN_KEPT + 8, block_size=4)
    for i in range(CHILDREN_KEPT + 1):  # the same first block, a different second one each
        computed(bm, make_seq([1, 2, 3, 4, 7, 7, 50 + i, 0, 9], rid=str(i)), 9)
    old, new = make_seq([1, 2, 3, 4, 7, 7, 50, 1, 1]), make_seq([1, 2, 3, 4, 7, 7, 51, 1, 1])
    assert bm.cached_partial(old, bm.cached_prefix(old))[1] == 2  # its own child was dropped
    assert bm.cached_partial(new, bm.cached_prefix(new))[1] == 3
