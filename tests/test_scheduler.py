"""Scheduler: token budget, chunked prefill, admission, priority, preemption order."""

from __future__ import annotations

from jobrunner.sched import BlockManager, Scheduler, Sequence, SequenceStatus
from jobrunner.types import FinishReason, Request, SamplingParams


def make_seq(tokens, max_new=8, priority=0, eos=()) -> Sequence:
    req = Request(f"r{tokens[0]}", list(tokens), SamplingParams(), priority=priority)
    return Sequence(req, max_new_tokens=max_new, eos_token_ids=frozenset(eos))


def make_sched(num_blocks=16, block_size=4, max_num_seqs=8, max_batch_tokens=100) -> Scheduler:
    bm = BlockManager(num_blocks, block_size)
    return Scheduler(bm, max_num_seqs, max_batch_tokens, max_model_len=1000)


def rows(batch) -> list[tuple[int, int]]:
    return [(s.seq_id, n) for s, n in zip(batch.seqs, batch.num_new_tokens, strict=True)]


def test_budget_chunks_a_prompt_then_mixes_prefill_with_decode():
    s = make_sched(max_batch_tokens=10)
    a, b = make_seq(range(6)), make_seq(range(100, 106))
    s.add(a)
    s.add(b)
    batch = s.schedule()
    assert rows(batch) == [(a.seq_id, 6), (b.seq_id, 4)]
    assert a.block_table == [0, 1] and b.block_table == [2]
    assert s.postprocess(batch, [[7], None]) == []
    assert a.token_ids[-1] == 7 and b.num_computed_tokens == 4 and b.num_output_tokens == 0
    batch = s.schedule()
    assert rows(batch) == [(a.seq_id, 1), (b.seq_id, 2)]
    assert batch.num_decode_tokens == 1 and batch.num_prefill_tokens == 2
    assert b.block_table == [2, 3]


def test_max_num_seqs_limits_admission():
    s = make_sched(max_num_seqs=2)
    seqs = [make_seq(range(i * 10, i * 10 + 3)) for i in range(3)]
    for q in seqs:
        s.add(q)
    assert [q.seq_id for q in s.schedule().seqs] == [seqs[0].seq_id, seqs[1].seq_id]
    assert s.num_waiting == 1 and s.num_running == 2


def test_priority_then_arrival():
    s = make_sched(max_num_seqs=1)
    low, high, low2 = make_seq([1]), make_seq([2], priority=5), make_seq([3])
    for q in (low, high, low2):
        s.add(q)
    order = []
    for _ in range(3):
        batch = s.schedule()
        order.append(batch.seqs[0])
        s.finish(batch.seqs[0], FinishReason.STOP)
    assert order == [high, low, low2]


def test_preempts_newest_lowest_priority_and_recomputes_with_prefix_hit():
    s = make_sched(num_blocks=4, block_size=2)
    a, b = make_seq([1, 2, 3], max_new=3), make_seq([11, 12, 13])
    s.add(a)
    s.add(b)
    batch = s.schedule()
    assert a.block_table == [0, 1] and b.block_table == [2, 3]
    s.postprocess(batch, [[4], [14]])
    s.postprocess(s.schedule(), [[5], [15]])  # a, b hold 5 tokens each, 4 computed
    batch = s.schedule()  # a needs a third block: none free
    assert rows(batch) == [(a.seq_id, 1)] and batch.preempted == [b]
    assert a.block_table == [0, 1, 3]  # b's tail block was evicted first
    assert b.status is SequenceStatus.WAITING and b.block_table == [] and b.num_computed_tokens == 0
    assert s.num_preemptions == 1
    assert s.postprocess(batch, [[6]]) == [a]  # a reached max_new_tokens
    assert a.finish_reason is FinishReason.LENGTH
    batch = s.schedule()  # b comes back: its first block is still cached
    assert rows(batch) == [(b.seq_id, 3)]
    assert b.block_table == [2, 3, 1] and batch.start_positions == [2]
    assert b.token_ids == [11, 12, 13, 14, 15]  # generated tokens are kept and recomputed
    assert b.num_cached_tokens == 0  # usage counts the first admission only


def test_eos_finishes_and_frees_blocks():
    s = make_sched()
    a = make_seq([1, 2, 3], eos=[9])
    s.add(a)
    batch = s.schedule()
    assert s.postprocess(batch, [[9]]) == [a]
    assert a.finish_reason is FinishReason.STOP and a.output_token_ids == [9]
    assert s.block_manager.num_free_blocks == 16 and s.num_running == 0


def test_finished_waiting_sequence_is_skipped():
    s = make_sched()
    a, b = make_seq([1]), make_seq([2])
    s.add(a)
    s.add(b)
    s.finish(a, FinishReason.STOP)
    assert s.schedule().seqs == [b]


def test_prefix_hit_counts_cached_tokens():
    s = make_sched(block_size=2)
    a = make_seq([1, 2, 3, 4, 5])
    s.add(a)
    s.postprocess(s.schedule(), [[6]])
    b = make_seq([1, 2, 3, 4, 7])
    s.add(b)
    batch = s.schedule()
    assert rows(batch)[-1] == (b.seq_id, 1)
    assert b.num_cached_tokens == 4 and s.num_cached_tokens == 4
    assert b.block_table[:2] == a.block_table[:2]


def partial_hit(s: Scheduler):
    """Row a computed and cached; row b, admitted next, shares a's first block of 4 and the
    first 2 tokens of its second."""
    a = make_seq([1, 2, 3, 4, 5, 6, 7, 8, 9])
    s.add(a)
    s.postprocess(s.schedule(), [[10]])
    b = make_seq([1, 2, 3, 4, 5, 6, 70, 80, 90])
    s.add(b)
    return a, b, s.schedule()


def test_a_partial_head_is_copied_and_not_computed():
    s = make_sched(block_size=4)
    a, b, batch = partial_hit(s)
    assert rows(batch)[-1] == (b.seq_id, 3)  # 70, 80, 90: from position 6
    assert batch.start_positions[-1] == 6
    assert b.block_table[0] == a.block_table[0] and b.block_table[1] != a.block_table[1]
    assert batch.copies == [(a.block_table[1], b.block_table[1], 2)]
    assert b.num_cached_tokens == 6 and s.num_cached_tokens == 6


def test_a_step_that_does_not_run_sends_its_partial_hits_back():
    s = make_sched(block_size=4)
    _, b, batch = partial_hit(s)
    assert batch.copies and batch.heads_in_step == [b]
    s.abandon(batch)  # its copy perhaps never made: b's 5, 6 are not in its block
    assert b.status is SequenceStatus.WAITING and b.block_table == []
    assert b.num_computed_tokens == 0


def two_rows_one_head(s: Scheduler):
    """Two rows whose prompts share [1, 2, 3, 4] (two blocks of 2), added; the first step."""
    a, b = make_seq([1, 2, 3, 4, 5]), make_seq([1, 2, 3, 4, 7])
    s.add(a)
    s.add(b)
    return a, b, s.schedule()


def test_a_head_computed_in_the_step_is_shared_in_it():
    s = make_sched(block_size=2)
    a, b, batch = two_rows_one_head(s)
    # a computes [1, 2] [3, 4] whole in this step: b attends to them and computes only 7
    assert rows(batch) == [(a.seq_id, 5), (b.seq_id, 1)] and batch.start_positions[1] == 4
    assert b.block_table[:2] == a.block_table[:2] and batch.heads_in_step == [b]
    assert b.num_cached_tokens == 4
    assert s.block_manager.ref_counts[a.block_table[0]] == 2
    s.postprocess(batch, [[6], [8]])
    assert len(b.block_hashes) == 2  # its own next blocks chain on from the shared ones


def test_a_step_that_does_not_run_sends_the_rows_that_shared_in_it_back():
    s = make_sched(block_size=2)
    a, b, batch = two_rows_one_head(s)
    s.abandon(batch)  # out of memory: a's blocks were never computed
    assert b.status is SequenceStatus.WAITING and b.block_table == []
    assert s.block_manager.ref_counts[a.block_table[0]] == 1
    assert rows(s.schedule()) == [(a.seq_id, 5), (b.seq_id, 1)]


def test_blocks_shared_in_a_step_are_cached_when_the_row_computing_them_fails():
    s = make_sched(block_size=2)
    a, b, batch = two_rows_one_head(s)
    s.finish(a, FinishReason.ERROR, "nan")  # a's logits were not finite: a fails
    s.postprocess(batch, [None, [8]])
    c = make_seq([1, 2, 3, 4, 9])
    s.add(c)
    s.schedule()
    assert c.block_table[:2] == b.block_table[:2] and c.num_cached_tokens == 4


def test_rows_admitted_after_a_running_row_share_its_next_chunk():
    s = make_sched(block_size=2, max_batch_tokens=6)
    a = make_seq(range(1, 11))
    s.add(a)
    s.postprocess(s.schedule(), [None])  # a's first 6 tokens: blocks 0-2 named
    b = make_seq([1, 2, 3, 4, 5, 6, 7, 8, 99])
    s.add(b)
    batch = s.schedule()
    # a computes 7..10 (blocks 3 and 4 whole); b hits blocks 0-2 and shares block 3
    assert rows(batch) == [(a.seq_id, 4), (b.seq_id, 1)]
    assert b.block_table[:4] == a.block_table[:4] and b.num_cached_tokens == 8


def test_no_block_is_shared_with_the_prefix_cache_off():
    bm = BlockManager(16, 2, enable_prefix_caching=False)
    s = Scheduler(bm, 8, 100, max_model_len=1000)
    a, b, batch = two_rows_one_head(s)
    assert rows(batch) == [(a.seq_id, 5), (b.seq_id, 5)] and not batch.heads_in_step
