"""Linear layers on CPU with weights packed once (decode steps and prefill alike)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from jobrunner.engine.paged import cpu_kernels


class SmallRowLinear:
    """Linear layers on CPU with weights packed once, for float32 rows.

    float32 weights: our AVX-512, AVX2 or NEON kernel (csrc/small_gemm.c) for every row count
    where it builds, else oneDNN's prepacked linear for steps of up to ONEDNN_MAX_ROWS rows (decode,
    short prefill chunks) and F.linear beyond. The kernel takes a prefill step's many rows a
    slice at a time that stays in L2 (1 thread, SmolLM2's layer shapes: about 95 GFLOP/s, 92%
    of an AVX2 core's peak, against MKL's 82-89 at 1,024 and 4,096 rows; docs/performance.md).

    bfloat16 weights (a bfloat16 model whose activations stay float32: model.PagedCausalLM):
    the AVX-512 BF16 kernel (csrc/small_gemm_bf16.c), rows rounded to bfloat16 inside, float32
    accumulation and output; a bias is kept in float32. Without that kernel such a model keeps
    torch's bfloat16 linears (PagedCausalLM does not take this path).

    Packed copies are made lazily, one per weight, and live as long as the model."""

    ONEDNN_MAX_ROWS = 256  # oneDNN's packed path is within 5% of MKL at 256 rows, slower beyond

    def __init__(self) -> None:
        self.native = cpu_kernels.gemm_supported()
        self.max_rows = None if self.native else self.ONEDNN_MAX_ROWS  # None: every row count
        self.packed: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id(w) -> (w, packed)
        self.biases: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id(b) -> (b, float32)

    @staticmethod
    def usable(hf_model: Any) -> bool:
        """On CPU with a packed path for the model's dtype, and room for a second copy of the
        weights."""
        import psutil

        param = next(hf_model.parameters())
        if param.device.type != "cpu":  # before asking the kernels, which builds them
            return False
        weights = sum(p.numel() * p.element_size() for p in hf_model.parameters())
        if param.dtype == torch.float32:
            packed = cpu_kernels.gemm_supported() or torch.backends.mkldnn.is_available()
        else:
            packed = param.dtype == torch.bfloat16 and cpu_kernels.gemm_bf16_supported()
        return packed and 4 * weights < psutil.virtual_memory().available

    def __call__(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        if x.dtype != torch.float32 or x.dim() != 2:
            return F.linear(x, w, b)
        if w.dtype == torch.bfloat16:
            return cpu_kernels.small_gemm_bf16(
                x, self.packed_weight(w), self.float_bias(b), w.shape[0]
            )
        if self.max_rows is not None and x.shape[0] > self.max_rows:
            return F.linear(x, w, b)
        if self.native:
            return cpu_kernels.small_gemm(x, self.packed_weight(w), b, w.shape[0])
        return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight(w), b, "none", [], "")

    def rounded(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        """The float32 linear of bfloat16 rows x standing for float32 rows rounded where they
        were made (model.PagedCausalLM._rounds): the same bits as this linear of those rows."""
        if w.dtype == torch.bfloat16 and x.dim() == 2:
            return cpu_kernels.small_gemm_bf16(
                x, self.packed_weight(w), self.float_bias(b), w.shape[0]
            )
        return self(x.float(), w, b)

    def add_(
        self, y: torch.Tensor, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None
    ) -> None:
        """y += the linear of x (float32 rows, or bfloat16 ones: `rounded`), added block by
        block as the kernel makes it (AMX tiles or vdpbf16ps: the same bits; nothing the size
        of y written and read back), else the linear and then the add."""
        rows_ok = x.dim() == 2 and x.dtype in (torch.float32, torch.bfloat16)
        if w.dtype == torch.bfloat16 and rows_ok and y.dtype == torch.float32:
            n = w.shape[0]
            added = cpu_kernels.small_gemm_bf16_add_(
                y, x, self.packed_weight(w), self.float_bias(b), n
            )
            if added:
                return
        y += self.rounded(x, w, b) if x.dtype == torch.bfloat16 else self(x, w, b)

    def silu_gated(
        self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None
    ) -> torch.Tensor | None:
        """silu(gate) * up of the fused gate/up linear (w: gate rows, then as many up rows) in
        one kernel (cpu_kernels.small_gemm_bf16_silu: AMX tiles or vdpbf16ps), as bfloat16
        rows for the down projection (`rounded`); None where neither takes it, and the caller
        runs the linear and then the product. x: float32 rows, or bfloat16 ones (`rounded`)."""
        rows_ok = x.dim() == 2 and x.dtype in (torch.float32, torch.bfloat16)
        if not rows_ok or w.dtype != torch.bfloat16 or (w.shape[0] // 2) % 32:
            return None  # (bfloat16 weights here: usable() found the kernel built)
        return cpu_kernels.small_gemm_bf16_silu(
            x, self.packed_weight(w), self.float_bias(b), w.shape[0] // 2
        )

    def packed_weight(self, w: torch.Tensor) -> torch.Tensor:
        """w packed for this path's kernel: once, at its first use."""
        entry = self.packed.get(id(w))
        if entry is None or entry[0] is not w:
            entry = self.packed[id(w)] = (w, self._pack(w))
        return entry[1]

    def float_bias(self, b: torch.Tensor | None) -> torch.Tensor | None:
        """b as the bfloat16-weight kernels take it: float32 (copied once)."""
        if b is None or b.dtype == torch.float32:
            return b
        entry = self.biases.get(id(b))
        if entry is None or entry[0] is not b:
            entry = self.biases[id(b)] = (b, b.float())
        return entry[1]

    def _pack(self, w: torch.Tensor) -> torch.Tensor:
        if w.dtype == torch.bfloat16:
            return cpu_kernels.pack_gemm_weight_bf16(w)
        if self.native:
            return cpu_kernels.pack_gemm_weight(w)
        return torch.ops.mkldnn._reorder_linear_weight(w, None)
