"""New K/V rows in a 16-bit cache's dtype (the attention paths and the CPU kernel share it)."""

from __future__ import annotations

import torch

FLOAT16_MAX = 65504.0


def to_cache_dtype(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float16 saturates at its largest finite value (as the 8-bit formats clamp to theirs)
    instead of storing inf, which would make every score against that row NaN."""
    if x.dtype == dtype:
        return x
    if dtype == torch.float16:
        x = x.clamp(-FLOAT16_MAX, FLOAT16_MAX)
    return x.to(dtype)
