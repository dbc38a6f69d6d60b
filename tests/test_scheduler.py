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


def test_shared_head_waits_one_step_for_the_cache():
    s = make_sched(block_size=2)
    a, b = make_seq([1, 2, 3, 4, 5]), make_seq([1, 2, 3, 4, 7])
    s.add(a)
    s.add(b)
    batch = s.schedule()
    assert batch.seqs == [a]  # b's head is being computed by a in this step
    s.postprocess(batch, [[6]])
    batch = s.schedule()
    assert rows(batch) == [(a.seq_id, 1), (b.seq_id, 1)]
    assert b.num_cached_tokens == 4


def test_a_partial_head_is_copied_and_not_computed():
    s = make_sched(block_size=4)
    a = make_seq([1, 2, 3, 4, 5, 6, 7, 8, 9])
    s.add(a)
    s.postprocess(s.schedule(), [[10]])
    b = make_seq([1, 2, 3, 4, 5, 6, 70, 80, 90])
    s.add(b)
    batch = s.schedule()
    assert rows(batch)[-1] == (b.seq_id, 3)  # 70, 80, 90: from position 6
    assert batch.start_positions[-1] == 6
    assert b.block_table[0] == a.block_table[0] and b.block_table[1] != a.block_table[1]
    assert batch.copies == [(a.block_table[1], b.block_table[1], 2)]
    assert b.num_cached_tokens == 6 and s.num_cached_tokens == 6


def test_a_row_held_for_a_shared_head_lets_the_rows_after_it_in():
    s = make_sched(block_size=2)
    a, b, c = make_seq([1, 2, 3, 4, 5]), make_seq([1, 2, 3, 4, 7]), make_seq([8, 9, 10, 11])
    for x in (a, b, c):
        s.add(x)
    batch = s.schedule()
    assert batch.seqs == [a, c]  # b waits for a's head; c, behind it, does not
    s.postprocess(batch, [[6], [12]])
    batch = s.schedule()
    assert batch.seqs[-1] is b and b.num_cached_tokens == 4


def test_rows_behind_a_held_row_take_neither_its_place_nor_its_blocks():
    s = make_sched(num_blocks=16, block_size=4)
    a, b = make_seq([1, 2, 3, 4, 5], priority=1), make_seq([1, 2, 3, 4, 6], priority=1)
    c = make_seq(list(range(100, 120)), priority=0)
    for x in (a, b, c):
        s.add(x)
    assert s.schedule().seqs == [a]  # b waits for a's head; c, of lower priority, behind it
    s = make_sched(num_blocks=6, block_size=4)
    a, b, c = make_seq([1, 2, 3, 4, 5]), make_seq([1, 2, 3, 4, 6]), make_seq(range(100, 116))
    for x in (a, b, c):
        s.add(x)
    batch = s.schedule()
    assert batch.seqs == [a]  # c's 4 blocks would leave none for b's own
    s.postprocess(batch, [[7]])
    assert s.schedule().seqs == [a, b]
