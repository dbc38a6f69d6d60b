"""Greedy picks and the finite-logits check of the paged engine's sampler."""

from __future__ import annotations

import torch

from jobrunner.engine.sampler import RowSampler, sample
from jobrunner.types import SamplingParams


def test_greedy_takes_the_first_maximum_and_flags_nan_or_inf_rows_only():
    logits = torch.zeros(5, 10)
    logits[0, 3] = logits[0, 7] = 2.0  # a tie: the first index, as HF's argmax
    logits[1, 9] = float("nan")  # one NaN anywhere makes the row unusable
    logits[2, 0] = float("inf")
    logits[3, :4] = float("-inf")  # masked tokens only: still a good row
    logits[3, 5] = 1.0
    logits[4] = float("-inf")  # nothing left to pick
    greedy = RowSampler(SamplingParams(), seed=0, device=torch.device("cpu"), prompt_ids=[1])
    tokens, finite, _ = sample(logits, [greedy] * 5)
    assert finite == [True, False, False, True, False]
    assert tokens[0] == 3 and tokens[3] == 5
