"""Sampling one row's next token from its logits, with the row's own generator."""

from __future__ import annotations

from jobrunner.types import SamplingParams


def sample_row(logits, p: SamplingParams, gen) -> int:
    """logits: (V,) float32. Greedy when temperature is 0; else temperature, top-k, top-p."""
    import torch

    if p.greedy:
        return int(torch.argmax(logits))
    logits = logits / p.temperature
    if p.top_k and p.top_k < logits.numel():
        kth = torch.topk(logits, p.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if p.top_p < 1.0:
        sorted_p, order = torch.sort(probs, descending=True)
        drop = torch.cumsum(sorted_p, 0) - sorted_p > p.top_p  # keep the smallest head >= top_p
        sorted_p[drop] = 0.0
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_p)
    return int(torch.multinomial(probs, 1, generator=gen))
