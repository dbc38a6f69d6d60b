"""int8 weights, per output channel (symmetric), weight-only, on PyTorch's own int8 kernels.

CPU: `torch._weight_int8pack_mm` for up to WEIGHT_ONLY_MAX_ROWS token rows (decode steps),
where it beats bf16 by 1.3-2.5x on this host; past that it falls behind bf16, so larger steps
(prefill) dequantize the weight into the GEMM: the same values, so the same outputs. A float32
model's rows enter that kernel rounded to bfloat16 (its float32 path is 20-30x slower), so on
CPUs where float32 is the fast dtype int8 weights save memory, not time.
Dynamic int8 activations (`torch._int_mm` on VNNI) were measured too: 3-4x faster than bf16
for prefill-sized steps, but SmolLM2's activation outliers make per-token int8 activations
lose greedy agreement badly (0/16 tokens on some prompts), so they are not used.
Other devices dequantize inside the matmul (memory saved, not time). torchao wraps the same
aten kernels on CPU; calling them directly avoids a dependency and a 6 s import.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from jobrunner.engine.quant.base import Quantizer, flat

WEIGHT_ONLY_MAX_ROWS = 32  # the int8 kernel's break-even against bf16 on this host
# float32 activations: the kernel has no fast float32 path (16 rows x SmolLM2's lm_head: 236 ms,
# against 8 ms with the rows rounded to bfloat16), so they go in as bfloat16 up to this many
# rows, where that still beats dequantizing the weight into a float32 GEMM (2 cores, no AMX)
FLOAT32_VIA_BF16_MAX_ROWS = 64


def quantize_rows(w: torch.Tensor, qmax: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-row scale: w (N, K) ~ q (N, K) * scale (N, 1)."""
    scale = w.float().abs().amax(dim=-1, keepdim=True).clamp(min=1e-8) / qmax
    return (w.float() / scale).round_().clamp_(-qmax, qmax), scale


class Int8Linear(nn.Module):
    def __init__(self, qweight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.register_buffer("qweight", qweight)  # (N, K) int8
        self.register_buffer("scale", scale)  # (N,) in the compute dtype
        self.register_buffer("scale_bf16", scale.to(torch.bfloat16), persistent=False)
        self.bias = bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self._mm(flat(x)).view(*x.shape[:-1], -1)
        return y if self.bias is None else y + self.bias

    def _mm(self, x: torch.Tensor) -> torch.Tensor:  # (M, K) -> (M, N)
        if self.qweight.device.type == "cpu":
            if x.dtype == torch.float32 and x.shape[0] <= FLOAT32_VIA_BF16_MAX_ROWS:
                xb = x.to(torch.bfloat16)
                return torch._weight_int8pack_mm(xb, self.qweight, self.scale_bf16).float()
            if x.dtype != torch.float32 and x.shape[0] <= WEIGHT_ONLY_MAX_ROWS:
                return torch._weight_int8pack_mm(x, self.qweight, self.scale)
        return F.linear(x, self.qweight.to(x.dtype)) * self.scale


class Int8Embedding(nn.Module):
    def __init__(self, qweight: torch.Tensor, scale: torch.Tensor):
        super().__init__()
        self.register_buffer("qweight", qweight)  # (V, D) int8, shared with a tied lm_head
        self.register_buffer("scale", scale)  # (V,)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.qweight[ids].to(self.scale.dtype) * self.scale[ids, None]


class Int8Quantizer(Quantizer):
    name = "int8"
    bits = 8

    def quantize_weight(self, weight: torch.Tensor) -> dict[str, torch.Tensor]:
        q, scale = quantize_rows(weight, 127.0)
        return {"qweight": q.to(torch.int8), "scale": scale[:, 0].to(weight.dtype)}

    def linear(self, state, bias) -> nn.Module:
        return Int8Linear(state["qweight"], state["scale"], bias)

    def embedding(self, weight, state) -> nn.Module:
        state = state or self.quantize_weight(weight)
        return Int8Embedding(state["qweight"], state["scale"])
