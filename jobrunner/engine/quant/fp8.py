"""fp8 (e4m3) weights with per-output-channel scales and dynamic per-token activation scales,
on PyTorch's own `torch._scaled_mm` (row-wise scaling). Needs a GPU with fp8 tensor cores
(compute capability 8.9 / 9.0 and newer: Ada, Hopper, Blackwell); elsewhere a ConfigError.
"""

from __future__ import annotations

import torch
from torch import nn

from jobrunner.engine.quant.base import Quantizer, flat
from jobrunner.errors import ConfigError

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0


def to_fp8_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x (M, K) -> fp8 (M, K) and float32 scale (M, 1) with x ~ q * scale."""
    scale = x.float().abs().amax(dim=-1, keepdim=True).clamp(min=1e-12) / FP8_MAX
    return (x.float() / scale).clamp_(-FP8_MAX, FP8_MAX).to(FP8), scale


class Fp8Linear(nn.Module):
    def __init__(self, weight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.register_buffer("weight", weight)  # (N, K) float8_e4m3fn
        self.register_buffer("scale", scale.t().contiguous())  # (1, N) float32
        self.bias = bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xq, xs = to_fp8_rows(flat(x))  # (M, K), (M, 1)
        y = torch._scaled_mm(
            xq, self.weight.t(), scale_a=xs, scale_b=self.scale, out_dtype=x.dtype
        ).view(*x.shape[:-1], -1)  # (..., N)
        return y if self.bias is None else y + self.bias


class Fp8Embedding(nn.Module):
    def __init__(self, weight: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype):
        super().__init__()
        self.register_buffer("weight", weight)  # (V, D) fp8, shared with a tied lm_head
        self.register_buffer("scale", scale)  # (V, 1) float32
        self.dtype = dtype

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows = self.weight.view(torch.uint8)[ids].view(FP8)  # gathered as bytes
        return (rows.float() * self.scale[ids]).to(self.dtype)


class Fp8Quantizer(Quantizer):
    name = "fp8"
    bits = 8

    def check(self, device, dtype) -> None:
        if device.type != "cuda":
            raise ConfigError(
                f"model.quantization: fp8 needs a CUDA GPU with fp8 support (Hopper"
                f" or newer); this run is on {device}. Use int8 or int4 here."
            )
        cap = torch.cuda.get_device_capability(device)
        if cap < (8, 9):
            name = torch.cuda.get_device_name(device)
            raise ConfigError(
                f"model.quantization: fp8 needs compute capability 8.9+ (Ada,"
                f" Hopper or newer); {name} is {cap[0]}.{cap[1]}. Use int8."
            )
        if dtype != torch.bfloat16:
            raise ConfigError(
                "model.quantization: fp8 computes in bfloat16; set model.dtype:"
                f" bfloat16 or auto (got {str(dtype).removeprefix('torch.')})"
            )

    def supports(self, weight: torch.Tensor) -> str | None:
        n, k = weight.shape
        return None if n % 16 == 0 and k % 16 == 0 else f"shape {n}x{k} not a multiple of 16"

    def quantize_weight(self, weight: torch.Tensor) -> dict[str, torch.Tensor]:
        q, scale = to_fp8_rows(weight)
        return {"weight": q, "scale": scale}

    def linear(self, state, bias) -> nn.Module:
        return Fp8Linear(state["weight"], state["scale"], bias)

    def embedding(self, weight, state) -> nn.Module:
        state = state or self.quantize_weight(weight)
        return Fp8Embedding(state["weight"], state["scale"], weight.dtype)
