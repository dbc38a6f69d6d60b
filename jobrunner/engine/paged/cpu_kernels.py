"""Native CPU kernels (csrc/*.c), compiled with the system C compiler at first use.

Plain C through ctypes: no torch headers, so a build takes about a second, not a minute. Built
with -fopenmp and loaded after torch, a kernel binds to the libgomp.so.1 torch already loaded and
runs on torch's thread pool (no second pool fighting it for the cores). The
shared object is cached under ~/.cache/jobrunner/kernels ($JOBRUNNER_CACHE/kernels), keyed
by the source, the compiler and this CPU's flags (`-march=native` code, `-mcpu=native` on
aarch64, must not run on another CPU). Without a compiler, or with JOBRUNNER_CPU_KERNELS=0,
`load()` returns None and callers use their torch path; the reason is logged once.

The vector path is the CPU's (csrc/isa.h); `isa()` says which, and the load logs it:
- avx512, avx2 (+FMA, F16C): every kernel has its vector code. With AVX-512 BF16, bfloat16
  weights have their linear kernel (small_gemm_bf16.c); with AMX as well, its steps of
  amx_rows() rows or more run on AMX tiles (small_gemm_amx.c), and so does prefill attention
  over a bfloat16 cache (paged_prefill_amx.c); JOBRUNNER_AMX_ROWS sets the threshold, 0 turns
  AMX off for both, and the load log says so.
- neon (aarch64: Graviton, Ampere, Grace): the few-row linears (small_gemm.c, the same packed
  panels and contract as AVX2), the norms and SiLU, and decode attention (its plain C path with
  NEON row loads, dot products, softmax and V sum: csrc/decode_neon.h) are vectorised; prefill
  attention keeps torch's SDPA and bfloat16 weights torch's linears. No SVE code: on Neoverse
  V1 and V2 its FMA throughput is NEON's. Tested on x86 by cross-compiling and running under
  qemu-aarch64, for correctness only (tests/test_aarch64_kernels.py).
- scalar (x86 without AVX2, other ISAs): plain C; decode attention, the norms and RoPE run it,
  while the few-row linears and prefill attention keep their torch paths.
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
from jobrunner.engine.paged.cache_dtype import to_cache_dtype

log = logging.getLogger(__name__)

SOURCES = sorted((Path(__file__).with_name("csrc")).glob("*.c"))
TORCH_WITHOUT_VECTORS = "few-row linears (oneDNN) and prefill attention (SDPA) run in torch"
TORCH_ON_NEON = "prefill attention (SDPA) and bfloat16 linears run in torch"
HEADERS = sorted((Path(__file__).with_name("csrc")).glob("*.h"))
DTYPES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
QUANTIZED = {"int8": 3, "fp8": 4}  # codes + a float16 scale per row (engine/quant/kv.py)
_i64, _ptr = ctypes.c_int64, ctypes.c_void_p


@functools.cache
def load() -> ctypes.CDLL | None:
    if os.environ.get("JOBRUNNER_CPU_KERNELS", "1") == "0":
        log.info("CPU kernels off (JOBRUNNER_CPU_KERNELS=0): decode attention gathers with torch")
        return None
    try:
        lib = ctypes.CDLL(str(_build()))
    except (OSError, subprocess.SubprocessError, RuntimeError) as exc:
        log.info("CPU kernels unavailable (%s): decode attention gathers with torch", exc)
        return None
    lib.paged_decode.restype = ctypes.c_int
    lib.paged_decode.argtypes = [_ptr] * 5 + [ctypes.c_int, _ptr, _i64, _ptr]
    lib.paged_decode.argtypes += [_i64] * 6 + [ctypes.c_float, _ptr, ctypes.c_int]
    lib.kv_write.restype = None
    lib.kv_write.argtypes = [_ptr] * 5 + [_i64] * 9 + [ctypes.c_int]
    lib.kv_write_q8.restype = ctypes.c_int
    lib.kv_write_q8.argtypes = [_ptr] * 7 + [_i64] * 8 + [ctypes.c_int] * 2
    lib.paged_prefill.restype = ctypes.c_int
    lib.paged_prefill.argtypes = [_ptr, _i64] + [_ptr] * 4 + [ctypes.c_int, _ptr] + [_i64] * 7
    lib.paged_prefill.argtypes += [ctypes.c_float, _ptr, ctypes.c_int, ctypes.c_int]
    lib.paged_prefill_supports.restype = ctypes.c_int
    lib.paged_prefill_supports.argtypes = [_i64] * 3
    lib.rope_inplace.restype = None
    lib.rope_inplace.argtypes = [_ptr] + [_i64] * 4 + [_ptr, _ptr, _ptr, ctypes.c_int]
    lib.rope_kv_write.restype = ctypes.c_int
    lib.rope_kv_write.argtypes = [_ptr] + [_i64] * 5 + [_ptr] * 5 + [ctypes.c_int, _ptr, _i64]
    lib.rope_kv_write.argtypes += [ctypes.c_int]
    lib.rms_norm.restype = None
    lib.rms_norm.argtypes = [_ptr, _i64, _ptr, ctypes.c_float, _ptr, _i64, _i64, ctypes.c_int]
    lib.rms_norm_bf16.restype = ctypes.c_int
    lib.rms_norm_bf16.argtypes = lib.rms_norm.argtypes
    lib.silu_mul.restype = None
    lib.silu_mul.argtypes = [_ptr, _i64, _ptr, _i64, _i64, ctypes.c_int]
    lib.small_gemm_fast.restype = ctypes.c_int
    lib.small_gemm_fast.argtypes = []
    lib.small_gemm.restype = None
    lib.small_gemm.argtypes = [_ptr, _i64, _ptr, _ptr, _ptr] + [_i64] * 3 + [ctypes.c_int]
    lib.small_gemm_panel.restype = ctypes.c_int
    lib.small_gemm_panel.argtypes = []
    lib.small_gemm_bf16_fast.restype = ctypes.c_int
    lib.small_gemm_bf16_fast.argtypes = []
    lib.small_gemm_bf16.restype = ctypes.c_int
    lib.small_gemm_bf16.argtypes = [_ptr, _i64, _ptr, _ptr, _ptr] + [_i64] * 3 + [ctypes.c_int]
    lib.small_gemm_bf16_silu.restype = ctypes.c_int
    lib.small_gemm_bf16_silu.argtypes = [_ptr, _i64, ctypes.c_int, _ptr, _ptr, _ptr]
    lib.small_gemm_bf16_silu.argtypes += [_i64] * 3 + [ctypes.c_int]
    lib.small_gemm_bf16_add.restype = ctypes.c_int
    lib.small_gemm_bf16_add.argtypes = [_ptr, _i64, ctypes.c_int, _ptr, _ptr, _ptr, _i64]
    lib.small_gemm_bf16_add.argtypes += [_i64] * 3 + [ctypes.c_int]
    lib.small_gemm_bf16_rows.restype = ctypes.c_int
    lib.small_gemm_bf16_rows.argtypes = [_ptr, _i64, _ptr, _ptr, _ptr] + [_i64] * 3 + [ctypes.c_int]
    lib.small_gemm_bf16_panel.restype = ctypes.c_int
    lib.small_gemm_bf16_panel.argtypes = []
    lib.row_first_index.restype = None
    lib.row_first_index.argtypes = [_ptr, _i64, _ptr, _i64, _i64, _ptr, ctypes.c_int]
    lib.decode_layers.restype = ctypes.c_int
    lib.decode_layers.argtypes = [_ptr, _ptr, _i64, _ptr] + [_i64] * 6 + [_ptr] * 4
    lib.decode_layers.argtypes += [ctypes.c_int, _ptr, _i64, _ptr, _i64, _i64, ctypes.c_float]
    lib.decode_layers.argtypes += [ctypes.c_int] * 2
    lib.small_gemm_bf16_amx_rows.restype = _i64
    lib.small_gemm_bf16_amx_rows.argtypes = [_i64]
    lib.small_gemm_split_rows.restype = _i64
    lib.small_gemm_split_rows.argtypes = [_i64]
    lib.kernel_isa.restype = ctypes.c_char_p
    lib.kernel_isa.argtypes = []
    amx_rows = _env_rows(os.environ.get("JOBRUNNER_AMX_ROWS", ""))
    if amx_rows is not None:
        lib.small_gemm_bf16_amx_rows(amx_rows)
    isa_name = lib.kernel_isa().decode()
    if lib.small_gemm_bf16_fast() and lib.small_gemm_bf16_amx_rows(-1):
        rows = lib.small_gemm_bf16_amx_rows(-1)
        isa_name += (
            f" with AMX tiles for bfloat16 steps of {rows} rows or more and prefill attention"
        )
    if isa_name == "scalar":
        log.info("CPU kernels built without AVX2 or AVX-512 (plain C): %s", TORCH_WITHOUT_VECTORS)
    elif isa_name == "neon":
        log.info("CPU kernels built for neon (aarch64): %s", TORCH_ON_NEON)
    else:
        log.info("CPU kernels built for %s", isa_name)
    return lib


def _env_rows(value: str) -> int | None:
    """JOBRUNNER_AMX_ROWS as a row count; None when unset, or (logged) not a count."""
    if not value:
        return None
    if value.isdigit():
        return int(value)
    log.warning("JOBRUNNER_AMX_ROWS=%r is not a row count (0 turns AMX off): ignored", value)
    return None


def amx_rows(rows: int | None = None) -> int:
    """The row count from which bfloat16 linears run on AMX tiles (0: not on this CPU, or off),
    after setting it to `rows` when given (0 turns AMX off, prefill attention's tiles too;
    JOBRUNNER_AMX_ROWS sets it at load)."""
    lib = load()
    if lib is None or not lib.small_gemm_bf16_fast():
        return 0
    return int(lib.small_gemm_bf16_amx_rows(-1 if rows is None else rows))


def gemm_split_rows(rows: int | None = None) -> int:
    """The rows a thread from which the linear kernels (float32, and bfloat16 on vdpbf16ps)
    split a step's rows among the threads rather than its output panels (csrc/small_gemm.c),
    after setting it to `rows` when given; 0 where they are not built."""
    lib = load()
    return 0 if lib is None else int(lib.small_gemm_split_rows(-1 if rows is None else rows))


def isa() -> str | None:
    """The vector path the kernels were built with: avx512, avx2, neon or scalar; None: not
    built."""
    lib = load()
    return None if lib is None else lib.kernel_isa().decode()


def _build() -> Path:
    return build_library("cpu", SOURCES, HEADERS)


def decode_supported(stored: torch.dtype | str, device: torch.device) -> bool:
    """Whether the decode kernel can read a KV cache stored as this on this device: a plain
    cache's dtype, or an 8-bit format's name (engine/quant/kv.py)."""
    return device.type == "cpu" and (stored in DTYPES or stored in QUANTIZED) and load() is not None


def supports(cache: object) -> bool:
    """Whether the decode kernel can read this layer cache in place: a plain tensor, or a
    quantized cache's codes and scales."""
    if isinstance(cache, torch.Tensor):
        return cache.is_contiguous() and decode_supported(cache.dtype, cache.device)
    codes, scales = getattr(cache, "codes", None), getattr(cache, "scales", None)
    return (
        isinstance(codes, torch.Tensor)
        and codes.device.type == "cpu"
        and codes.is_contiguous()
        and scales.is_contiguous()
        and scales.dtype == torch.float16
        and cache.fmt.name in QUANTIZED
        and load() is not None
    )


def _cache_args(cache) -> tuple[int, int | None, int]:
    """(data pointer, scales pointer or None, the kernel's dtype code) of one layer cache."""
    if isinstance(cache, torch.Tensor):
        return cache.data_ptr(), None, DTYPES[cache.dtype]
    return cache.codes.data_ptr(), cache.scales.data_ptr(), QUANTIZED[cache.fmt.name]


def _attention_io(q: torch.Tensor, k_cache, v_cache):
    """float32 queries, an output like them, and each cache's (pointer, scales, dtype code)."""
    qf = q.to(torch.float32).contiguous()
    return qf, torch.empty_like(qf), _cache_args(k_cache), _cache_args(v_cache)


def paged_decode(
    q: torch.Tensor,  # (b, nh, hd)
    k_cache,  # (nkv, num_blocks, bs, hd): a tensor, or a QuantizedKV (engine/quant/kv.py)
    v_cache,
    block_tables: torch.Tensor,  # (b, nb) int64
    context_lens: torch.Tensor,  # (b,) int64
    scale: float,
) -> torch.Tensor:  # (b, nh, hd), q's dtype
    lib = load()
    b, nh, hd = q.shape
    nkv, num_blocks, bs, _ = k_cache.shape
    qf, out, (k, k_scales, code), (v, v_scales, _) = _attention_io(q, k_cache, v_cache)
    tables = block_tables.to(torch.int64).contiguous()
    lens = context_lens.to(torch.int64).contiguous()
    rc = lib.paged_decode(
        qf.data_ptr(), k, v, k_scales, v_scales, code,
        tables.data_ptr(), tables.shape[1], lens.data_ptr(),
        b, nh, nkv, hd, num_blocks, bs, scale, out.data_ptr(), torch.get_num_threads(),
    )  # fmt: skip
    if rc != 0:
        raise MemoryError("paged_decode: out of memory for attention scores")
    return out.to(q.dtype)


def prefill_supported(nh: int, nkv: int, hd: int) -> bool:
    """Whether the prefill kernel handles this head layout on this CPU (else torch's SDPA)."""
    lib = load()
    return lib is not None and bool(lib.paged_prefill_supports(nh, nkv, hd))


def paged_prefill(
    q: torch.Tensor,  # (n, nh, hd): a chunk's queries, positions start..start+n-1
    k_cache,  # (nkv, num_blocks, bs, hd) holding the chunk's own K/V rows already
    v_cache,
    block_ids: torch.Tensor,  # (nb,) int64 block ids of positions 0..start+n-1
    start: int,
    scale: float,
    out: torch.Tensor | None = None,  # (n, nh, hd) float32, contiguous: written in place
) -> torch.Tensor:  # (n, nh, hd), q's dtype (out itself where given and q is float32)
    """Causal attention of a prefill chunk to its cached context and itself, read in place.
    float32 queries are read at their own row stride (heads contiguous within a row, as sliced
    from the fused q/k/v projection); `out` takes the outputs with no copy."""
    lib, dtype = load(), q.dtype
    n, nh, hd = q.shape
    nkv, num_blocks, bs, _ = k_cache.shape
    if q.dtype != torch.float32 or q.stride(-1) != 1 or q.stride(-2) != hd:
        q = q.to(torch.float32).contiguous()
    if out is None or out.dtype != torch.float32 or not out.is_contiguous():
        out = torch.empty(n, nh, hd, dtype=torch.float32)
    (k, k_scales, code), (v, v_scales, _) = _cache_args(k_cache), _cache_args(v_cache)
    table = block_ids.to(torch.int64).contiguous()
    # an 8-bit cache of a bfloat16 model may take the bfloat16 tiles (csrc/paged_prefill_amx.c)
    tiles_8bit = int(getattr(k_cache, "dtype", None) == torch.bfloat16 and k_scales is not None)
    rc = lib.paged_prefill(
        q.data_ptr(), q.stride(0), k, v, k_scales, v_scales, code, table.data_ptr(),
        start, n, nh, nkv, hd, num_blocks, bs, scale, out.data_ptr(), torch.get_num_threads(),
        tiles_8bit,
    )  # fmt: skip
    if rc != 0:
        raise ValueError(f"paged_prefill: head layout nh={nh} nkv={nkv} hd={hd} not supported")
    return out.to(dtype)


def write_kv_(
    k_cache,  # (nkv, num_blocks, bs, hd), contiguous: a tensor, or a QuantizedKV
    v_cache,
    slots: torch.Tensor,  # (T,) int64 flat slot (block * bs + offset) of each new token
    k: torch.Tensor,  # (T, nkv, hd), head_dim contiguous
    v: torch.Tensor,
) -> None:
    """Copies each token's K and V rows into its slot (index_copy_ takes ~130 us a layer for a
    47-row decode step; this takes a few). Rows of another dtype (a float32 model over a 16-bit
    cache) are converted first. An 8-bit cache quantizes in the same pass, byte for byte as its
    torch write would (which takes ~80 us a layer for a 52-row step)."""
    if not isinstance(k_cache, torch.Tensor):
        return _write_quantized(k_cache, v_cache, slots, k, v)
    k, v = to_cache_dtype(k, k_cache.dtype), to_cache_dtype(v, v_cache.dtype)
    if k.stride(-1) != 1 or v.stride(-1) != 1:
        raise ValueError("write_kv_: K/V rows must have head_dim contiguous")
    nkv, num_blocks, bs, hd = k_cache.shape
    slots = slots.to(torch.int64).contiguous()
    load().kv_write(
        k_cache.data_ptr(), v_cache.data_ptr(), k.data_ptr(), v.data_ptr(), slots.data_ptr(),
        k.shape[0], nkv, hd, num_blocks * bs, k.element_size(),
        k.stride(0), k.stride(1), v.stride(0), v.stride(1), torch.get_num_threads(),
    )  # fmt: skip


def _write_quantized(k_cache, v_cache, slots, k, v) -> None:
    k, v = k.to(torch.float32), v.to(torch.float32)
    if k_cache.fmt.name in QUANTIZED and k.stride(-1) == 1 and v.stride(-1) == 1:
        nkv, num_blocks, bs, hd = k_cache.shape
        slots = slots.to(torch.int64).contiguous()
        failed = load().kv_write_q8(
            k_cache.codes.data_ptr(), k_cache.scales.data_ptr(), v_cache.codes.data_ptr(),
            v_cache.scales.data_ptr(), k.data_ptr(), v.data_ptr(), slots.data_ptr(),
            k.shape[0], nkv, hd, num_blocks * bs, k.stride(0), k.stride(1), v.stride(0),
            v.stride(1), int(k_cache.fmt.name == "fp8"), torch.get_num_threads(),
        )  # fmt: skip
        if not failed:
            return
    k_cache.write(slots, k)
    v_cache.write(slots, v)


def rope_supported(dtype: torch.dtype, device: torch.device) -> bool:
    return device.type == "cpu" and dtype == torch.float32 and load() is not None


def rope_(
    x: torch.Tensor,  # (T, H, hd) float32, heads contiguous within a row
    cos: torch.Tensor,  # (max_len, hd) float32, contiguous
    sin: torch.Tensor,
    positions: torch.Tensor,  # (T,) int64
) -> torch.Tensor:
    """Rotates x in place (bit-identical to HF's rotate_half form) and returns it."""
    T, H, hd = x.shape
    if x.stride(-1) != 1 or x.stride(-2) != hd:
        raise ValueError(f"rope_: heads must be contiguous within a row, strides {x.stride()}")
    pos = positions.to(torch.int64).contiguous()
    load().rope_inplace(
        x.data_ptr(), T, H, hd, x.stride(0), cos.data_ptr(), sin.data_ptr(), pos.data_ptr(),
        torch.get_num_threads(),
    )  # fmt: skip
    return x


def rope_kv_write_(
    qkv: torch.Tensor,  # (T, nh + 2 nkv, hd) float32: q, k, v heads, heads contiguous in a row
    nh: int,
    cos: torch.Tensor,  # (max_len, hd) float32, contiguous
    sin: torch.Tensor,
    positions: torch.Tensor,  # (T,) int64
    k_cache: torch.Tensor,  # (nkv, num_blocks, bs, hd) float32 or bfloat16, contiguous
    v_cache: torch.Tensor,
    slots: torch.Tensor,  # (T,) int64 flat slot of each token
) -> bool:
    """Rotates q and k in place and writes the new K/V rows into their slots, in one pass: the
    same bits as rope_ and then write_kv_. False (nothing done) where it does not apply: a
    cache of another dtype or layout, or rows it cannot read in place."""
    T, heads, hd = qkv.shape
    nkv = (heads - nh) // 2
    usable = (
        qkv.dtype == torch.float32
        and qkv.stride(-1) == 1
        and qkv.stride(-2) == hd
        and isinstance(k_cache, torch.Tensor)
        and k_cache.dtype in (torch.float32, torch.bfloat16)
        and v_cache.dtype == k_cache.dtype
        and k_cache.is_contiguous()
        and v_cache.is_contiguous()
        and tuple(k_cache.shape[::3]) == (nkv, hd)
    )
    if not usable or load() is None:
        return False
    pos = positions.to(torch.int64).contiguous()
    slots = slots.to(torch.int64).contiguous()
    rc = load().rope_kv_write(
        qkv.data_ptr(), T, qkv.stride(0), nh, nkv, hd, cos.data_ptr(), sin.data_ptr(),
        pos.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), DTYPES[k_cache.dtype],
        slots.data_ptr(), k_cache.shape[1] * k_cache.shape[2], torch.get_num_threads(),
    )  # fmt: skip
    return rc == 0


def gemm_supported() -> bool:
    """Whether the few-row linear kernel has its vector path on this CPU (AVX-512, AVX2, NEON)."""
    lib = load()
    return lib is not None and lib.small_gemm_fast() == 1


def pack_gemm_weight(w: torch.Tensor, width: int | None = None) -> torch.Tensor:
    """(N, K) float32 -> (ceil(N/P), K, P) panels, the extra columns zero; P is `width`, by
    default the build's panel width (32 columns with AVX-512, 16 with AVX2 and NEON:
    csrc/small_gemm.c)."""
    n, k = w.shape
    width = width or load().small_gemm_panel()
    panels = -(-n // width)
    padded = w.new_zeros(panels * width, k)
    padded[:n] = w
    return padded.view(panels, width, k).transpose(1, 2).contiguous()


def small_gemm(
    x: torch.Tensor,  # (M, K) float32, any row stride
    packed: torch.Tensor,  # pack_gemm_weight(w)
    bias: torch.Tensor | None,  # (N,) float32
    n: int,
) -> torch.Tensor:  # (M, N)
    """x @ w.T + bias on packed weights, for steps of few rows."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    m, k = x.shape
    dtypes = {x.dtype, packed.dtype} | ({bias.dtype} if bias is not None else set())
    if packed.shape[1] != k or dtypes != {torch.float32}:
        raise ValueError(f"small_gemm: x {tuple(x.shape)} {x.dtype} against {tuple(packed.shape)}")
    y = x.new_empty(m, n)
    b = None if bias is None else bias.contiguous()
    load().small_gemm(
        x.data_ptr(), x.stride(0), packed.data_ptr(), None if b is None else b.data_ptr(),
        y.data_ptr(), m, n, k, torch.get_num_threads(),
    )  # fmt: skip
    return y


def gemm_bf16_supported() -> bool:
    """Whether the linear kernel for bfloat16 weights builds on this CPU (AVX-512 BF16)."""
    lib = load()
    return lib is not None and lib.small_gemm_bf16_fast() == 1


def pack_gemm_weight_bf16(w: torch.Tensor) -> torch.Tensor:
    """(N, K) -> (ceil(N/32), ceil(K/2), 32, 2) bfloat16: panels of 32 columns holding pairs of
    k (csrc/small_gemm_bf16.c), the extra columns and the odd k zero."""
    n, k = w.shape
    width = load().small_gemm_bf16_panel()
    panels, pairs = -(-n // width), -(-k // 2)
    padded = w.new_zeros(panels * width, 2 * pairs, dtype=torch.bfloat16)
    padded[:n, :k] = w
    pair_words = padded.view(torch.int32).view(panels, width, pairs)  # a k pair as one word
    return (
        pair_words.transpose(1, 2).contiguous().view(torch.bfloat16).view(panels, pairs, width, 2)
    )


def small_gemm_bf16(
    x: torch.Tensor,  # (M, K) float32, or bfloat16 rows already rounded; any row stride
    packed: torch.Tensor,  # pack_gemm_weight_bf16(w)
    bias: torch.Tensor | None,  # (N,) float32
    n: int,
) -> torch.Tensor:  # (M, N) float32
    """x @ w.T + bias with bfloat16 weights: x rounded to bfloat16, float32 accumulation.
    bfloat16 x is taken as the float32 rows it was rounded from would be (the same bits): read
    in place by the AMX tiles and by the vdpbf16ps kernel, widened first only where neither
    is built."""
    x = _rows(x)
    m, k = x.shape
    _check_bf16_linear("small_gemm_bf16", x, packed, bias, k, n)
    y = x.new_empty(m, n, dtype=torch.float32)
    b = _contiguous(bias)
    args = (packed.data_ptr(), _ptr_of(b), y.data_ptr(), m, n, k)
    lib, threads = load(), torch.get_num_threads()
    if x.dtype == torch.bfloat16:
        rc = lib.small_gemm_bf16_rows(x.data_ptr(), x.stride(0), *args, threads)
        if rc != 3:
            return _checked(rc, y, "small_gemm_bf16")
        x = x.float()  # exact: the kernel rounds it back to the same bits
    rc = lib.small_gemm_bf16(x.data_ptr(), x.stride(0), *args, threads)
    return _checked(rc, y, "small_gemm_bf16")


def small_gemm_bf16_silu(
    x: torch.Tensor,  # (M, K) float32, or bfloat16 rows already rounded; any row stride
    packed: torch.Tensor,  # pack_gemm_weight_bf16(w) of a fused gate/up weight (2n, K)
    bias: torch.Tensor | None,  # (2n,) float32
    n: int,
) -> torch.Tensor | None:  # (M, n) bfloat16
    """silu(x Wg^T + bg) * (x Wu^T + bu) in one pass, on the AMX tiles where the step takes them
    (n and K multiples of 32), else on vdpbf16ps (n a multiple of 32), rounded to bfloat16 for
    the down projection (which takes such rows in place): the same bits as small_gemm_bf16
    then silu_mul, then that rounding, without writing out the (M, 2n) projection. None where
    neither kernel takes it (no AVX-512 BF16, n off the 32-column panels): run those two."""
    x = _rows(x)
    m, k = x.shape
    _check_bf16_linear("small_gemm_bf16_silu", x, packed, bias, k, 2 * n)
    if n % 32:  # off the panels: neither kernel takes it
        return None
    y = x.new_empty(m, n, dtype=torch.bfloat16)
    b = _contiguous(bias)
    rc = load().small_gemm_bf16_silu(
        x.data_ptr(), x.stride(0), int(x.dtype == torch.bfloat16), packed.data_ptr(), _ptr_of(b),
        y.data_ptr(), m, 2 * n, k, torch.get_num_threads(),
    )  # fmt: skip
    return None if rc == 3 else _checked(rc, y, "small_gemm_bf16_silu")


def small_gemm_bf16_add_(
    y: torch.Tensor,  # (M, N) float32, unit column stride: updated in place
    x: torch.Tensor,  # (M, K) float32, or bfloat16 rows already rounded; any row stride
    packed: torch.Tensor,  # pack_gemm_weight_bf16(w)
    bias: torch.Tensor | None,  # (N,) float32
    n: int,
) -> bool:
    """y += x @ w.T + bias, each block added into y as it is made (AMX tiles where the step
    takes them, else vdpbf16ps): the same bits as `y += small_gemm_bf16(...)`, without writing
    the linear out and reading it back. False (y untouched) where neither kernel takes it, or
    y is not float32 with unit column stride and rows at least n apart: the caller runs those
    two."""
    x = _rows(x)
    m, k = x.shape
    _check_bf16_linear("small_gemm_bf16_add_", x, packed, bias, k, n)
    if tuple(y.shape) != (m, n):
        raise ValueError(f"small_gemm_bf16_add_: y {tuple(y.shape)} for ({m}, {n})")
    if y.dtype != torch.float32 or y.stride(-1) != 1:
        return False
    b = _contiguous(bias)
    rc = load().small_gemm_bf16_add(
        x.data_ptr(), x.stride(0), int(x.dtype == torch.bfloat16), packed.data_ptr(), _ptr_of(b),
        y.data_ptr(), y.stride(0), m, n, k, torch.get_num_threads(),
    )  # fmt: skip
    return rc != 3 and _checked(rc, y, "small_gemm_bf16_add_") is y


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x with unit column stride and rows that do not overlap (the kernels read each row's K
    values at its row stride; an expanded tensor's rows are copied out)."""
    return x if x.stride(-1) == 1 and x.stride(0) >= x.shape[1] else x.contiguous()


def _contiguous(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.contiguous()


def _ptr_of(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


@functools.cache
def _panel_width() -> int:
    return load().small_gemm_bf16_panel()


def _check_bf16_linear(name: str, x, packed, bias, k: int, n: int) -> None:
    rows_ok = x.dtype in (torch.float32, torch.bfloat16)
    bias_ok = bias is None or (bias.dtype == torch.float32 and bias.numel() == n)
    packed_ok = packed.shape[0] == -(-n // _panel_width()) and packed.shape[1] == -(-k // 2)
    if packed.dtype != torch.bfloat16 or not (packed_ok and rows_ok and bias_ok):
        raise ValueError(
            f"{name}: x {tuple(x.shape)} {x.dtype} against {tuple(packed.shape)} for {n} outputs"
        )


def _checked(rc: int, y: torch.Tensor, name: str) -> torch.Tensor:
    if rc != 0:
        raise MemoryError(f"{name}: out of memory for the bfloat16 rows")
    return y


def decode_layers(
    table: torch.Tensor,  # (L, LAYER_PTRS) int64: each layer's addresses (csrc/decode_layers.c)
    eps: torch.Tensor,  # (L, 2) float32: the two norms' epsilons
    h: torch.Tensor,  # (T, H) float32, contiguous: the residual stream, updated in place
    heads: tuple[int, int, int, int],  # nh, nkv, hd, the MLP's intermediate size
    rope: tuple[torch.Tensor, torch.Tensor, torch.Tensor],  # cos, sin tables; positions (T,)
    slots: torch.Tensor,  # (T,) where each row's K/V go
    cache: torch.Tensor,  # one layer's K cache: its dtype and shape stand for every layer's
    block_tables: torch.Tensor,  # (T, nb)
    context_lens: torch.Tensor,  # (T,)
    scale: float,
    float_weights: bool = False,  # the table's linears packed by pack_gemm_weight (float32)
) -> None:
    """Every decoder layer of a decode step, h updated in place (native_layers.NativeLayers):
    the kernels the Python forward calls layer by layer, in one call. The table's linears are
    bfloat16 packed by pack_gemm_weight_bf16, or float32 (`float_weights`)."""
    nh, nkv, hd, n = heads
    cos, sin, positions = rope
    pos, slots = positions.to(torch.int64).contiguous(), slots.to(torch.int64).contiguous()
    tables = block_tables.to(torch.int64).contiguous()
    lens = context_lens.to(torch.int64).contiguous()
    (t, d), (_, num_blocks, bs, _) = h.shape, cache.shape
    rc = load().decode_layers(
        table.data_ptr(), eps.data_ptr(), table.shape[0], h.data_ptr(), t, d, nh, nkv, hd, n,
        cos.data_ptr(), sin.data_ptr(), pos.data_ptr(), slots.data_ptr(), DTYPES[cache.dtype],
        tables.data_ptr(), tables.shape[1], lens.data_ptr(), num_blocks, bs, scale,
        torch.get_num_threads(), int(float_weights),
    )  # fmt: skip
    if rc == 1:
        raise MemoryError("decode_layers: out of memory for the step's rows")
    if rc != 0:
        raise RuntimeError("decode_layers: a kernel declined a step NativeLayers took")


def row_max(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """torch.max(logits, dim=-1) for greedy sampling: each row's maximum (NaN where it holds
    one) and the index of its first occurrence, the maximum by torch.amax and the index by
    csrc/row_max.c; None where the kernels do not take the tensor (not float32 rows on CPU)."""
    if not rows_supported(logits) or logits.shape[1] == 0:
        return None
    best = logits.amax(dim=-1)
    index = torch.empty(logits.shape[0], dtype=torch.int64)
    load().row_first_index(
        logits.data_ptr(), logits.stride(0), best.data_ptr(), logits.shape[0], logits.shape[1],
        index.data_ptr(), torch.get_num_threads(),
    )  # fmt: skip
    return best, index


def rows_supported(x: torch.Tensor) -> bool:
    """Whether the row kernels (rms_norm, silu_mul) take x: float32 on CPU, 2-D, unit stride."""
    return (
        x.device.type == "cpu"
        and x.dtype == torch.float32
        and x.dim() == 2
        and x.stride(-1) == 1
        and load() is not None
    )


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) * weight per row of x (T, D), in one pass; dtype bfloat16:
    rounded to it on the way out as the linear kernels round their rows (to nearest even,
    subnormals to zero: `vcvtneps2bf16`), the rows a bfloat16-weight linear takes in place;
    without AVX-512 BF16 in the build, by torch after (which keeps subnormals)."""
    t, d = x.shape
    w = weight.contiguous()
    if w.dtype != torch.float32 or w.numel() != d:
        raise ValueError(f"rms_norm: weight {tuple(w.shape)} {w.dtype} for rows of {d}")
    args = (x.data_ptr(), x.stride(0), w.data_ptr(), eps)
    if dtype == torch.bfloat16:
        y = x.new_empty(t, d, dtype=torch.bfloat16)
        if load().rms_norm_bf16(*args, y.data_ptr(), t, d, torch.get_num_threads()) == 0:
            return y
    y = x.new_empty(t, d)
    load().rms_norm(*args, y.data_ptr(), t, d, torch.get_num_threads())
    return y.to(dtype)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for rows of a fused gate/up projection (T, 2n) -> (T, n), in one pass."""
    t, two_n = gate_up.shape
    y = gate_up.new_empty(t, two_n // 2)
    load().silu_mul(
        gate_up.data_ptr(), gate_up.stride(0), y.data_ptr(), t, two_n // 2, torch.get_num_threads()
    )
    return y
