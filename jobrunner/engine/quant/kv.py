"""A quantized paged KV cache (`model.kv_cache_dtype: int8 | fp8`).

Each (token, KV head) vector of head_dim values is stored in 8 bits with one float16 scale
(symmetric absmax), and dequantized to the compute dtype when attention gathers it. With
head_dim 64 that is 66 bytes per head-token instead of 128 (bfloat16) or 256 (float32), so the
same memory holds about twice (four times) as many blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

SCALE_DTYPE = torch.float16


@dataclass(frozen=True)
class KVFormat:
    name: str
    storage: torch.dtype  # what a value is written as
    qmax: float

    def bytes_per_value_head(self, head_dim: int) -> int:
        """Bytes for one token's values of one KV head (codes + scale)."""
        return head_dim + SCALE_DTYPE.itemsize


KV_FORMATS = {
    "int8": KVFormat("int8", torch.int8, 127.0),
    "fp8": KVFormat("fp8", torch.float8_e4m3fn, 448.0),
}


class QuantizedKV:
    """One layer's K (or V): codes (nkv, num_blocks, bs, hd) as bytes + scales (nkv, nb, bs, 1)."""

    def __init__(
        self, fmt: KVFormat, shape: tuple[int, ...], dtype: torch.dtype, device, zeroed=True
    ):
        self.fmt = fmt
        self.dtype = dtype  # the compute dtype gathers return
        new = torch.zeros if zeroed else torch.empty  # see allocate
        self.codes = new(shape, dtype=torch.uint8, device=device)
        self.scales = new((*shape[:-1], 1), dtype=SCALE_DTYPE, device=device)

    @property
    def shape(self) -> torch.Size:
        return self.codes.shape

    def write(self, slot_mapping: torch.Tensor, x: torch.Tensor) -> None:
        """x (T, nkv, hd) into flat slots (T,)."""
        nkv, hd = self.codes.shape[0], self.codes.shape[-1]
        xt = x.transpose(0, 1).float()  # (nkv, T, hd)
        scale = xt.abs().amax(dim=-1, keepdim=True).clamp(min=1e-6) / self.fmt.qmax
        q = (xt / scale).clamp_(-self.fmt.qmax, self.fmt.qmax)
        q = q.round_() if self.fmt.storage == torch.int8 else q
        codes = q.to(self.fmt.storage).view(torch.uint8)
        self.codes.view(nkv, -1, hd).index_copy_(1, slot_mapping, codes)
        self.scales.view(nkv, -1, 1).index_copy_(1, slot_mapping, scale.to(SCALE_DTYPE))

    def read(self, slot_mapping: torch.Tensor) -> torch.Tensor:
        """The values at flat slots (T,), dequantized: (T, nkv, hd) in the compute dtype."""
        nkv, hd = self.codes.shape[0], self.codes.shape[-1]
        codes = self.codes.view(nkv, -1, hd).index_select(1, slot_mapping).view(self.fmt.storage)
        scales = self.scales.view(nkv, -1, 1).index_select(1, slot_mapping)
        return (codes.to(self.dtype) * scales.to(self.dtype)).transpose(0, 1)

    def gather(self, block_ids: torch.Tensor) -> torch.Tensor:
        """Blocks (..., nb) -> dequantized (..., nkv, nb * bs, hd) in the compute dtype."""
        codes = _gather(self.codes, block_ids).view(self.fmt.storage)
        return codes.to(self.dtype) * _gather(self.scales, block_ids).to(self.dtype)


def _gather(cache: torch.Tensor, block_ids: torch.Tensor) -> torch.Tensor:
    g = cache[:, block_ids]  # (nkv, ..., nb, bs, x)
    return g.movedim(0, -4).flatten(-3, -2)  # (..., nkv, nb * bs, x)


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, fmt: str) -> int:
    return 2 * num_layers * num_kv_heads * KV_FORMATS[fmt].bytes_per_value_head(head_dim)


def allocate(
    num_layers: int, shape: tuple[int, ...], fmt: str, dtype, device, zeroed: bool = True
) -> list:
    """Each layer's K and V caches. `zeroed=False` leaves them unwritten: only for readers
    that read written positions alone (the CPU kernels; a gather of whole blocks would meet
    unwritten scales, and 0 x NaN is NaN), so start-up does not write zeros to gigabytes."""
    f = KV_FORMATS[fmt]
    return [
        (QuantizedKV(f, shape, dtype, device, zeroed), QuantizedKV(f, shape, dtype, device, zeroed))
        for _ in range(num_layers)
    ]
