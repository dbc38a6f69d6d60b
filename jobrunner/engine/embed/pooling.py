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
    seg = torch.repeat_interleave(
        torch.arange(len(lens), device=hidden.device), ends.diff(prepend=ends.new_zeros(1))
    )
    sums = hidden.new_zeros(len(lens), hidden.shape[1], dtype=torch.float32)
    sums.index_add_(0, seg, hidden.float())
    return sums / torch.tensor(lens, device=hidden.device, dtype=torch.float32)[:, None]
