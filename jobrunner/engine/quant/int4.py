"""int4 weights, group-wise (asymmetric min/max per group of `group_size` input channels).

Linear layers run on PyTorch's own CPU kernel (`torch._weight_int4pack_mm_for_cpu`) with its
packed layout; a float32 model's rows enter it rounded to bfloat16 (its float32 path is ~60x
slower). That layout is opaque (blocked for AVX-512), so the input embedding keeps its
own plain nibble-packed copy and we gather + unpack rows by hand: no PyTorch op does a 4-bit
embedding lookup outside the deprecated torch.ao path. Only CPU: the CUDA kernel needs a
different packing we cannot test here, so CUDA asks for int8 or fp8 (ConfigError).
"""

from __future__ import annotations

import torch
from torch import nn

from jobrunner.engine.quant.base import Quantizer, flat
from jobrunner.errors import ConfigError

GROUP_SIZE = 64


def quantize_groups(w: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """w (N, K) -> q (N, K) in 0..15, scale and zero (N, K/group) with w ~ (q - 8) * scale + zero."""
    n, k = w.shape
    wg = w.float().view(n, k // group, group)
    lo, hi = wg.amin(-1), wg.amax(-1)
    scale = ((hi - lo) / 15).clamp(min=1e-8)
    q = ((wg - lo[..., None]) / scale[..., None]).round_().clamp_(0, 15)
    return q.view(n, k).to(torch.int32), scale, lo + 8 * scale


class Int4Linear(nn.Module):
    def __init__(self, packed: torch.Tensor, scales_zeros: torch.Tensor, group: int, bias):
        super().__init__()
        self.register_buffer("packed", packed)  # (N, K/2) uint8, the kernel's own layout
        self.register_buffer("scales_zeros", scales_zeros)  # (K/group, N, 2)
        self.register_buffer("sz_bf16", scales_zeros.to(torch.bfloat16), persistent=False)
        self.group = group
        self.bias = bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = flat(x)
        if x2.dtype == torch.float32:  # the kernel's float32 path is ~60x slower than bfloat16's
            y = torch._weight_int4pack_mm_for_cpu(
                x2.to(torch.bfloat16), self.packed, self.group, self.sz_bf16
            ).float()
        else:
            y = torch._weight_int4pack_mm_for_cpu(x2, self.packed, self.group, self.scales_zeros)
        y = y.view(*x.shape[:-1], -1)
        return y if self.bias is None else y + self.bias


class Int4Embedding(nn.Module):
    def __init__(self, nibbles: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, group: int):
        super().__init__()
        self.register_buffer("nibbles", nibbles)  # (V, D/2) uint8: low nibble = even column
        self.register_buffer("scale", scale)  # (V, D/group)
        self.register_buffer("zero", zero)
        self.group = group

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        b = self.nibbles[ids]  # (..., D/2)
        q = torch.stack((b & 15, b >> 4), dim=-1).flatten(-2).to(self.scale.dtype)  # (..., D)
        g = q.unflatten(-1, (-1, self.group))  # (..., D/group, group)
        return ((g - 8) * self.scale[ids, :, None] + self.zero[ids, :, None]).flatten(-2)


class Int4Quantizer(Quantizer):
    name = "int4"
    bits = 4

    def __init__(self, group_size: int = GROUP_SIZE):
        self.group = group_size

    def check(self, device, dtype) -> None:
        if device.type != "cpu":
            raise ConfigError(
                f"model.quantization: int4 runs on CPU only in this version (device {device});"
                " use int8 or fp8 on a GPU"
            )

    def supports(self, weight: torch.Tensor) -> str | None:
        k = weight.shape[-1]
        return (
            None if k % self.group == 0 else f"{k} input channels, not a multiple of {self.group}"
        )

    def quantize_weight(self, weight: torch.Tensor) -> dict[str, torch.Tensor]:
        q, scale, zero = quantize_groups(weight, self.group)
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
        sz = torch.stack([scale, zero], dim=-1).transpose(0, 1).contiguous()  # (K/g, N, 2)
        return {"packed": packed, "scales_zeros": sz.to(weight.dtype)}

    def linear(self, state, bias) -> nn.Module:
        return Int4Linear(state["packed"], state["scales_zeros"], self.group, bias)

    def embedding(self, weight, state) -> nn.Module | None:
        if self.supports(weight):
            return None
        q, scale, zero = quantize_groups(weight, self.group)
        nibbles = (q[:, 0::2] | (q[:, 1::2] << 4)).to(torch.uint8)  # (V, D/2)
        return Int4Embedding(nibbles, scale.to(weight.dtype), zero.to(weight.dtype), self.group)
