"""The encoder's native CPU kernels (csrc/: varlen attention, bias + GELU, residual + LayerNorm),
compiled with the system C compiler
at first use, as engine/paged/cpu_kernels.py builds its own (a separate library: the two evolve
apart). Loaded after torch and built with -fopenmp, it runs on torch's libgomp thread pool. The
shared object is cached under $JOBRUNNER_CACHE/kernels, keyed by the source, the compiler and
this CPU's flags. Without a compiler, or with JOBRUNNER_CPU_KERNELS=0, `load()` returns None
and the encoder keeps its torch attention; the reason is logged once.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import subprocess
from pathlib import Path

import torch

from jobrunner.engine.native_build import build_library

log = logging.getLogger(__name__)

SOURCES = sorted((Path(__file__).with_name("csrc")).glob("*.c"))
HEADERS = sorted((Path(__file__).with_name("csrc")).glob("*.h"))
_i64, _ptr = ctypes.c_int64, ctypes.c_void_p


@functools.cache
def load() -> ctypes.CDLL | None:
    if os.environ.get("JOBRUNNER_CPU_KERNELS", "1") == "0":
        log.info("encoder kernel off (JOBRUNNER_CPU_KERNELS=0): attention runs through torch")
        return None
    try:
        lib = ctypes.CDLL(str(build()))
    except (OSError, subprocess.SubprocessError, RuntimeError) as exc:
        log.info("encoder kernel unavailable (%s): attention runs through torch", exc)
        return None
    lib.varlen_attention.restype = ctypes.c_int
    lib.varlen_attention.argtypes = [_ptr] * 3 + [_i64] * 3 + [ctypes.c_float, _ptr, ctypes.c_int]
    lib.bias_gelu.restype = ctypes.c_int
    lib.bias_gelu.argtypes = [_ptr, _ptr, _i64, _i64, ctypes.c_int]
    lib.residual_layer_norm.restype = ctypes.c_int
    lib.residual_layer_norm.argtypes = [_ptr] * 5 + [ctypes.c_float, _ptr, _i64, _i64, ctypes.c_int]
    return lib


def build() -> Path:
    return build_library("embed", SOURCES, HEADERS)


def shapes_supported(head_dim: int, hidden_size: int, intermediate_size: int) -> bool:
    """Whether an encoder of these sizes runs on the kernels (AVX2 + FMA, 8-float vectors)."""
    sizes_ok = head_dim <= 128 and hidden_size <= 4096
    return sizes_ok and not (head_dim % 8 or hidden_size % 8 or intermediate_size % 8) and usable()


@functools.cache
def usable() -> bool:
    """The library loads and this CPU runs its vector code (a build without AVX2 returns 2)."""
    lib = load()
    if lib is None:
        return False
    x, b = torch.zeros(1, 8), torch.zeros(8)
    if lib.bias_gelu(x.data_ptr(), b.data_ptr(), 1, 8, 1) != 0:
        log.info("encoder kernels need AVX2 and FMA: attention runs through torch")
        return False
    return True


def supported(x: torch.Tensor) -> bool:
    """Whether the kernels can run on tensors like x (float32 on the CPU, a C compiler here)."""
    return x.dtype == torch.float32 and x.device.type == "cpu" and usable()


def varlen_attention(
    qkv: torch.Tensor,
    bias: torch.Tensor,
    offsets: torch.Tensor,
    num_heads: int,
    head_dim: int,
    out: torch.Tensor | None = None,
) -> torch.Tensor | None:
    """Bidirectional attention of each packed sequence over itself.

    qkv: (T, 3 nh hd) float32 CPU, contiguous: q, k, v of each token side by side, before
    `bias` (3 nh hd,) is added; offsets: (B + 1,) int64 token offsets of the sequences.
    Returns the context (T, nh hd), in `out` when given (contiguous float32), or None when the
    kernel cannot run here (the caller keeps its torch path)."""
    if not supported(qkv):
        return None
    qkv, bias = qkv.contiguous(), bias.contiguous()  # held: the kernel reads their memory
    offsets = offsets.to(torch.int64).contiguous()
    if out is None:
        out = torch.empty(qkv.shape[0], num_heads * head_dim, dtype=qkv.dtype)
    rc = load().varlen_attention(
        qkv.data_ptr(),
        bias.data_ptr(),
        offsets.data_ptr(),
        offsets.numel() - 1,
        num_heads,
        head_dim,
        head_dim**-0.5,
        out.data_ptr(),
        torch.get_num_threads(),
    )
    return out if rc == 0 else None


def bias_gelu_(x: torch.Tensor, bias: torch.Tensor) -> bool:
    """x = gelu(x + bias) in place (exact erf GELU), x (rows, cols) contiguous float32 CPU.
    False when the kernel cannot run here (x untouched)."""
    if not (supported(x) and x.is_contiguous() and bias.is_contiguous()):
        return False
    rows, cols = x.shape
    return load().bias_gelu(x.data_ptr(), bias.data_ptr(), rows, cols, torch.get_num_threads()) == 0


def residual_layer_norm_(
    y: torch.Tensor, bias: torch.Tensor, residual: torch.Tensor, norm: torch.nn.LayerNorm
) -> bool:
    """residual = norm(y + bias + residual) in place, all (rows, D) contiguous float32 CPU.
    False when the kernel cannot run here (nothing written)."""
    tensors = (y, bias, residual, norm.weight, norm.bias)
    if not (supported(y) and all(t.is_contiguous() for t in tensors)):
        return False
    rows, d = y.shape
    rc = load().residual_layer_norm(
        *(t.data_ptr() for t in tensors),
        norm.eps,
        residual.data_ptr(),
        rows,
        d,
        torch.get_num_threads(),
    )
    return rc == 0
