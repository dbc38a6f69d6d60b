"""Pooling packed hidden states (T, D), cut into segments by length: no padding is pooled."""

from __future__ import annotations

import torch


def pool(hidden: torch.Tensor, lens: list[int], mode: str) -> torch.Tensor:
    """(T, D) packed states of sequences of `lens` tokens -> (B, D) float32."""
    ends = torch.tensor(lens, device=hidden.device).cumsum(0)  # (B,)
    if mode == "cls":
        return hidden[ends - torch.tensor(lens, device=hidden.device)].float()
    if mode == "last":
        return hidden[ends - 1].float()
    # each sequence is one bag of consecutive rows: embedding_bag's mean, one pass, no scatter
    rows = torch.arange(hidden.shape[0], device=hidden.device)
    starts = ends - torch.tensor(lens, device=hidden.device)
    return torch.nn.functional.embedding_bag(rows, hidden.float(), starts, mode="mean")
