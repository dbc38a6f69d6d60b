"""Linear layers for decode steps of few rows on CPU, weights packed once."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from jobrunner.engine.paged import cpu_kernels


class SmallRowLinear:
    """Linear layers for steps of up to MAX_ROWS rows (decode, short prefill chunks) on CPU,
    float32, weights packed once: our AVX-512 or AVX2 kernel (csrc/small_gemm.c) where it builds,
    else oneDNN's prepacked linear. On SmolLM2's layer shapes (2 cores, 30 distinct layers, so the
    weights come from memory as in a real step, plus the lm_head), a step of 52 rows takes 50 ms
    with the kernel and 76 ms with MKL's F.linear; 16 rows 27 against 48 ms. The kernel makes
    about 310 GFLOP/s from 128 to 384 rows against MKL's 244 to 282, 305 against 294 at 512
    rows and 287 against 305 at 1,024, so larger steps keep F.linear. oneDNN is within 5% of MKL
    at 256 rows and slower beyond.
    Packed copies are made lazily, one per weight, and live as long as the model."""

    MAX_ROWS = 512  # with the kernel; oneDNN's packed path stops at ONEDNN_MAX_ROWS
    ONEDNN_MAX_ROWS = 256

    def __init__(self) -> None:
        self.native = cpu_kernels.gemm_supported()
        self.max_rows = self.MAX_ROWS if self.native else self.ONEDNN_MAX_ROWS
        self.packed: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id(w) -> (w, packed)

    @staticmethod
    def usable(hf_model: Any) -> bool:
        """float32 on CPU with a packed path, and room for a second copy of the weights."""
        import psutil

        param = next(hf_model.parameters())
        weights = sum(p.numel() * p.element_size() for p in hf_model.parameters())
        return (
            param.device.type == "cpu"
            and param.dtype == torch.float32
            and (cpu_kernels.gemm_supported() or torch.backends.mkldnn.is_available())
            and 4 * weights < psutil.virtual_memory().available
        )

    def __call__(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        if x.shape[0] > self.max_rows or x.dtype != torch.float32 or x.dim() != 2:
            return F.linear(x, w, b)
        entry = self.packed.get(id(w))
        if entry is None or entry[0] is not w:
            entry = self.packed[id(w)] = (w, self._pack(w))
        if self.native:
            return cpu_kernels.small_gemm(x, entry[1], b, w.shape[0])
        return torch.ops.mkldnn._linear_pointwise(x, entry[1], b, "none", [], "")

    def _pack(self, w: torch.Tensor) -> torch.Tensor:
        if self.native:
            return cpu_kernels.pack_gemm_weight(w)
        return torch.ops.mkldnn._reorder_linear_weight(w, None)
