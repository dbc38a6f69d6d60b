"""The sampler's logits processors against HF transformers' own, on fixed examples, and the
contract of the seam: history, accept(), drafts, the greedy fast path, raw logprobs."""

from __future__ import annotations

import pytest
import torch
from transformers.generation import logits_process as hf

from jobrunner.engine.sampler import (
    LogitsProcessor,
    RowSampler,
    processors_for,
    sample,
    warpers_for,
)
from jobrunner.types import SamplingParams

V = 12
PROMPT = [1, 3, 3, 5]
OUTPUT = [7, 3, 7, 7]


def logits() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.randn(V, generator=g) * 3  # (V,) with negative and positive entries


def row(**sampling) -> RowSampler:
    r = RowSampler(SamplingParams(**sampling), 5, torch.device("cpu"), PROMPT, eos={2})
    r.accept(list(OUTPUT))
    return r


def ours(r: RowSampler, x: torch.Tensor) -> torch.Tensor:
    for p in r.processors + r.warpers:
        x = p(x.clone(), r)
    return x


def theirs(processor, x: torch.Tensor, history: list[int]) -> torch.Tensor:
    return processor(torch.tensor([history]), x[None].clone())[0]


@pytest.mark.parametrize("penalty", [1.3, 0.7])
def test_repetition_penalty_is_hfs_over_prompt_and_output(penalty):
    x = logits()
    want = theirs(hf.RepetitionPenaltyLogitsProcessor(penalty), x, PROMPT + OUTPUT)
    torch.testing.assert_close(ours(row(repetition_penalty=penalty), x), want)


def test_warpers_are_hfs_in_hfs_order():
    x = logits()
    chain = [
        hf.TemperatureLogitsWarper(0.7),
        hf.TopKLogitsWarper(6),
        hf.TopPLogitsWarper(0.8),
        hf.MinPLogitsWarper(0.05),
    ]
    want = x
    for p in chain:
        want = theirs(p, want, PROMPT + OUTPUT)
    got = ours(row(temperature=0.7, top_k=6, top_p=0.8, min_p=0.05), x)
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    kept = ~torch.isinf(want)
    torch.testing.assert_close(got[kept], want[kept])


def test_min_tokens_bans_the_end_tokens_as_hf_until_reached():
    x = logits()
    for min_tokens, history in ((6, PROMPT + OUTPUT), (4, PROMPT + OUTPUT)):
        want = theirs(
            hf.MinNewTokensLengthLogitsProcessor(len(PROMPT), min_tokens, [2, 9]), x, history
        )
        got = ours(row(min_tokens=min_tokens, stop_token_ids=(9,)), x)
        torch.testing.assert_close(got, want)


def test_logit_bias_is_hfs_sequence_bias_of_single_tokens():
    x = logits()
    bias = ((4, 5.0), (8, -100.0))
    want = theirs(hf.SequenceBiasLogitsProcessor({(t,): b for t, b in bias}), x, PROMPT + OUTPUT)
    torch.testing.assert_close(ours(row(logit_bias=bias), x), want)


def test_presence_and_frequency_penalties_are_openais_over_the_output_only():
    x = logits()
    got = ours(row(presence_penalty=0.5, frequency_penalty=0.25), x)
    counts = torch.bincount(torch.tensor(OUTPUT), minlength=V).float()
    torch.testing.assert_close(got, x - 0.25 * counts - 0.5 * (counts > 0).float())


def test_penalties_follow_accepted_tokens():
    r = row(repetition_penalty=2.0, frequency_penalty=1.0)
    x = logits()
    ours(r, x)  # the processors build their state on the first call
    r.accept([11])
    fresh = RowSampler(r.params, 5, torch.device("cpu"), PROMPT, eos={2})
    fresh.accept(OUTPUT + [11])
    torch.testing.assert_close(ours(r, x), ours(fresh, x))


def test_greedy_rows_without_processors_take_the_fast_path_and_drafts():
    assert row().plain and row().allows_drafts and not processors_for(SamplingParams(), {2})
    assert not warpers_for(SamplingParams(top_k=3, top_p=0.5))  # greedy: argmax is unchanged
    assert not row(repetition_penalty=1.1).allows_drafts
    assert not row(temperature=1.0).allows_drafts
    assert row(logit_bias=((3, 1.0),)).allows_drafts  # history-free


class BanToken(LogitsProcessor):
    """The recipe of docs/DESIGN.md: a processor that bans one token and records accept()."""

    allows_drafts = True

    def __init__(self, token: int):
        self.token, self.accepted = token, []

    def __call__(self, logits, row):
        logits[self.token] = float("-inf")
        return logits

    def accept(self, tokens):
        self.accepted += tokens


def test_a_plugged_processor_changes_its_row_only_and_sees_accepted_tokens():
    x = torch.zeros(3, V)
    x[:, 4] = 5.0
    x[:, 6] = 4.0
    rows = [RowSampler(SamplingParams(), 0, torch.device("cpu"), PROMPT) for _ in range(3)]
    ban = BanToken(4)
    rows[1].add(ban)
    tokens, finite, logprobs = sample(x, rows)
    assert tokens == [4, 6, 4] and finite == [True] * 3 and logprobs == [None] * 3
    rows[1].accept([tokens[1]], [logprobs[1]])
    assert ban.accepted == [6] and rows[1].output_ids == [6]


def test_logprobs_are_the_raw_distribution_before_processors():
    x = logits()[None]
    r = RowSampler(
        SamplingParams(logprobs=True, top_logprobs=3, logit_bias=((0, -100.0),)),
        0,
        torch.device("cpu"),
        PROMPT,
    )
    tokens, _, (entry,) = sample(x, [r])
    raw = torch.log_softmax(x[0], -1)
    assert entry.token_id == tokens[0] != 0
    assert entry.logprob == pytest.approx(float(raw[tokens[0]]))
    top = raw.topk(3)
    assert [a.token_id for a in entry.top_logprobs] == top.indices.tolist()
    assert [a.logprob for a in entry.top_logprobs] == pytest.approx(top.values.tolist())


def test_seeded_draws_depend_on_the_row_seed_only():
    x = logits().repeat(4, 1)

    def draws(seeds):
        rows = [
            RowSampler(SamplingParams(temperature=1.0), s, torch.device("cpu"), []) for s in seeds
        ]
        return [sample(x[: len(seeds)], rows)[0] for _ in range(5)]

    alone = [t[0] for t in draws([11])]
    crowd = [t[2] for t in draws([3, 4, 11, 5])]
    assert alone == crowd
