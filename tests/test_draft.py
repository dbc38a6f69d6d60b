"""Speculative decoding by n-gram lookup: proposals, acceptance, and the scheduler's handling."""

from __future__ import annotations

from jobrunner.sched import BlockManager, Scheduler, Sequence
from jobrunner.sched.draft import NgramDrafter, accept
from jobrunner.types import FinishReason, Request, SamplingParams


def test_proposes_what_followed_the_latest_earlier_occurrence_of_the_tail():
    d = NgramDrafter()
    #        0  1  2  3  4  5  6  7  8  9
    tokens = [5, 6, 7, 8, 9, 5, 6, 7, 1, 2]
    assert d.propose(tokens, 3) == []  # tail (1, 2) / (8, 1, 2) never occurred before
    tokens += [5, 6, 7]  # tail (5, 6, 7) ended at 2 and at 7: the latest, 7, was followed by 1 2 5
    assert d.propose(tokens, 3) == [1, 2, 5]
    assert d.propose(tokens, 1) == [1]
    tokens += [1, 9]  # (7, 1, 9) is new; the 2-gram (1, 9) too
    assert d.propose(tokens, 4) == []
    tokens += [4, 1]  # the 2-gram (4, 1) is new; so is (9, 4, 1)
    assert d.propose(tokens, 4) == []
    tokens += [9]  # (1, 9) ended at 14, followed by 4 1 9 (the proposal runs up to the tail)
    assert d.propose(tokens, 5) == [4, 1, 9]
    assert d.propose(tokens, 0) == []


def test_incremental_index_matches_a_fresh_one():
    tokens = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4, 6, 2, 6, 4, 3, 3]
    live = NgramDrafter()
    for end in range(1, len(tokens) + 1):
        assert live.propose(tokens[:end], 4) == NgramDrafter().propose(tokens[:end], 4)


def test_accept_keeps_agreeing_drafts_and_the_models_next_token():
    assert accept([], [7]) == [7]
    assert accept([1, 2, 3], [1, 2, 3, 4]) == [1, 2, 3, 4]  # all agreed, plus a bonus token
    assert accept([1, 2, 3], [1, 5, 3, 4]) == [1, 5]  # second draft wrong: the model's choice
    assert accept([1, 2, 3], [9, 2, 3, 4]) == [9]  # nothing agreed: one token, as without drafts


def make_sched(num_blocks=16, k=3) -> Scheduler:
    bm = BlockManager(num_blocks, block_size=4)
    return Scheduler(bm, 8, 100, max_model_len=1000, speculative_tokens=k)


def make_seq(tokens, max_new=20, eos=(), temperature=0.0) -> Sequence:
    req = Request(f"r{tokens[0]}", list(tokens), SamplingParams(temperature=temperature))
    return Sequence(req, max_new_tokens=max_new, eos_token_ids=frozenset(eos))


def prefilled(s: Scheduler, seqs: list[Sequence], firsts: list[int]) -> None:
    """Admit the sequences, prefill them in one step and give each its first token."""
    for seq in seqs:
        s.add(seq)
    batch = s.schedule()
    assert batch.seqs == seqs and not any(batch.drafts)
    s.postprocess(batch, [[t] for t in firsts])


def test_a_generating_greedy_row_computes_its_drafts_and_keeps_what_the_model_agreed_with():
    s = make_sched()
    a = make_seq([1, 2, 3, 4, 1, 2])
    prefilled(s, [a], [3])  # tokens 1 2 3 4 1 2 3: the tail (1, 2, 3) was followed by 4 1 2
    batch = s.schedule()
    assert batch.drafts == [[4, 1, 2]] and batch.num_new_tokens == [4]
    assert batch.input_tokens(0) == [3, 4, 1, 2] and batch.samples(0)
    assert batch.num_decode_tokens == 4 and batch.num_prefill_tokens == 0
    assert len(a.block_table) == 3  # 7 + 3 positions: room for the drafts
    s.postprocess(batch, [[4, 1, 7]])  # the model agreed with 4 and 1, then chose 7
    assert a.output_token_ids == [3, 4, 1, 7]
    assert a.num_computed_tokens == 9 and a.num_uncomputed_tokens == 1  # 7 is computed next
    assert len(a.block_hashes) == 2  # full blocks of kept tokens only


def test_a_stop_token_among_the_kept_ones_ends_the_row_there():
    s = make_sched()
    a = make_seq([1, 2, 3, 4, 1, 2], eos=(1,))
    prefilled(s, [a], [3])
    batch = s.schedule()
    assert s.postprocess(batch, [[4, 1, 2]]) == [a]
    assert a.output_token_ids == [3, 4, 1] and a.finish_reason is FinishReason.STOP


def test_drafts_stay_within_max_new_tokens_and_skip_sampled_rows():
    s = make_sched()
    a = make_seq([1, 2, 3, 4, 1, 2], max_new=3)
    b = make_seq([11, 12, 13, 14, 11, 12], temperature=0.7)
    prefilled(s, [a, b], [3, 13])
    batch = s.schedule()
    assert batch.drafts == [[4], []]  # a may add 2 tokens more; b samples: no drafts
    assert s.postprocess(batch, [[4, 1], [5]]) == [a]
    assert a.output_token_ids == [3, 4, 1] and a.finish_reason is FinishReason.LENGTH


def test_drafts_never_preempt():
    s = make_sched(num_blocks=3)
    a, b = make_seq([1, 2, 3, 4, 1, 2]), make_seq([9, 9, 9])
    prefilled(s, [a, b], [3, 9])  # a holds blocks 0, 1 and b block 2: the cache is full
    batch = s.schedule()  # both tails predict drafts, which would need a block each
    assert batch.drafts == [[], []] and batch.num_new_tokens == [1, 1]
    assert not batch.preempted and s.num_preemptions == 0
    assert a.drafter.propose(a.token_ids, 3) == [4, 1, 2]  # there were drafts to make
