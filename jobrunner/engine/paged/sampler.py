"""Next-token sampling: greedy, temperature, top-k, top-p, with one generator per row.

Each row draws from its own `torch.Generator` seeded from `Request.seq_seed`, so a row's
samples depend only on its logits and its seed, never on its batch neighbours.
"""

from __future__ import annotations

import torch

from jobrunner.types import SamplingParams


class RowSampler:
    """Sampling state for one sequence (its generator advances one draw per token)."""

    def __init__(self, params: SamplingParams, seed: int, device: torch.device):
        self.params = params
        self.generator = None
        if not params.greedy:
            self.generator = torch.Generator(device=device)
            self.generator.manual_seed(seed & 0xFFFF_FFFF_FFFF_FFFF)

    def sample(self, logits: torch.Tensor) -> int:  # logits: (V,) float32
        p = self.params
        logits = logits / p.temperature
        if p.top_k > 0:
            kth = torch.topk(logits, min(p.top_k, logits.shape[-1])).values[-1]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        if p.top_p < 1.0:
            probs = _top_p(probs, p.top_p)
        return int(torch.multinomial(probs, 1, generator=self.generator))


def _top_p(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches top_p."""
    sorted_probs, order = probs.sort(descending=True)
    outside = sorted_probs.cumsum(-1) - sorted_probs > top_p  # mass before the token already enough
    sorted_probs[outside] = 0.0
    return torch.zeros_like(probs).scatter_(-1, order, sorted_probs)


def sample(logits: torch.Tensor, samplers: list[RowSampler]) -> tuple[list[int], list[bool]]:
    """Tokens for each row of logits (R, V), and whether the row's logits were usable: a NaN or
    +inf anywhere in a row becomes its maximum, so checking the R maxima finds it (a -inf logit
    only rules its token out). One pass over the logits instead of four."""
    best, tokens = logits.max(dim=-1)  # greedy rows are done here: the first maximal index
    finite = torch.isfinite(best).tolist()
    tokens = tokens.tolist()
    for i, s in enumerate(samplers):
        if s.generator is not None and finite[i]:
            tokens[i] = s.sample(logits[i])
    return tokens, finite
