"""Paged attention on CUDA through our Triton kernel (triton_kernel.py), in place in the cache.

One launch attends every decode row (a tile per row, grid (rows, nkv)); a second attends every
prompt chunk, split into tiles of new tokens, the tiles with the most keys first. Neither gathers
the cache nor builds a mask, and the decode launch reads only fixed-shape tensors, so a CUDA graph
can capture it (cuda_graphs.py). float32, float16 and bfloat16 caches are read, and the 8-bit
formats (int8, fp8: codes and a scale per row) dequantized as they load.

With TRITON_INTERPRET=1 the same kernel runs on CPU tensors (slowly): that is how the tests check
it without a GPU.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cache

import torch

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MAX_HEAD_DIM = 256
PREFILL_ROWS = 64  # query rows (tokens x padded group) per prefill tile
DECODE_ROWS = 16  # tl.dot's smallest M: a decode tile pads its G query heads up to this
BLOCK_N = 64  # keys per inner step
# A program stages its query tile and a step of keys and values in shared memory. Wider elements
# (float32, the exact mode) or rows (head_dim over 128) each halve the prefill tile and the key
# step, which keeps every program under 99 KiB (the most an sm_86 / sm_89 block has).


@dataclass
class TritonBatch:
    """One step's sequences, decode rows first (the runner's token order), as int32 tensors."""

    tables: torch.Tensor  # (S, W) block ids (padding 0)
    q_start: torch.Tensor  # (S,)
    q_len: torch.Tensor  # (S,)
    ctx: torch.Tensor  # (S,)
    num_decode: int  # sequences 0..num_decode-1 have one new token each
    tile_seg: torch.Tensor | None = None  # (tiles,) prefill tiles: sequence index
    tile_q0: torch.Tensor | None = None  # (tiles,) first new token of the tile
    tile_tokens: int = 1  # new tokens per prefill tile (prefill_tokens)


@cache
def available() -> bool:
    try:
        from jobrunner.engine.paged import triton_kernel  # noqa: F401
    except Exception:  # not installed, or a build without a backend for this machine
        return False
    return True


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def wanted(device: torch.device) -> bool:
    """CUDA runs the kernel unless JOBRUNNER_TRITON=0 (the torch path, for comparison);
    JOBRUNNER_TRITON=1 asks for it elsewhere too (on CPU with TRITON_INTERPRET=1: tests)."""
    flag = os.environ.get("JOBRUNNER_TRITON", "auto")
    return flag == "1" or (flag != "0" and device.type == "cuda")


CODES = {"int8": 1, "fp8": 2}  # 8-bit cache formats (engine/quant/kv.py) the kernel reads


def _parts(cache) -> tuple[torch.Tensor, torch.Tensor | None, int]:
    """(values or byte codes, per-row scales or None, the kernel's CODES) of a layer's cache: a
    tensor, or a QuantizedKV (codes + scales)."""
    if isinstance(cache, torch.Tensor):
        return cache, None, 0
    return cache.codes, cache.scales, CODES[cache.fmt.name]


def supports(cache: object, num_heads: int, num_kv_heads: int, head_dim: int) -> bool:
    """Whether the kernel can attend over this layer's cache for this head layout."""
    if isinstance(cache, torch.Tensor):
        if cache.dtype not in DTYPES:
            return False
    elif getattr(getattr(cache, "fmt", None), "name", None) not in CODES:
        return False
    values = _parts(cache)[0]
    on_device = values.device.type == "cuda" or interpreting()
    fits = head_dim <= MAX_HEAD_DIM and num_heads % num_kv_heads == 0
    return on_device and fits and available()


def _pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def _halvings(dtype: torch.dtype, hd: int) -> int:
    return int(dtype == torch.float32) + int(hd > 128)


def prefill_tokens(group: int, dtype: torch.dtype, hd: int) -> int:
    """New tokens per prefill tile: PREFILL_ROWS query rows (fewer for wide elements or rows)
    of `group` (padded) heads each."""
    return max(1, (PREFILL_ROWS >> _halvings(dtype, hd)) // _pow2(group))


def build_batch(
    tables: list[list[int]],  # each sequence's context blocks, decode rows first
    q_start: list[int],
    q_len: list[int],
    ctx: list[int],
    num_decode: int,
    tile_tokens: int,  # prefill_tokens(...)
    device: torch.device,
) -> TritonBatch:
    """The tensors for a step; prefill tiles ordered by their keys, the most first."""
    width = max(map(len, tables), default=1)
    tiles = [
        (s, q0) for s in range(num_decode, len(tables)) for q0 in range(0, q_len[s], tile_tokens)
    ]
    tiles.sort(key=lambda t: -(ctx[t[0]] - q_len[t[0]] + t[1]))

    def ints(values) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int32, device=device)

    batch = TritonBatch(
        ints([t + [0] * (width - len(t)) for t in tables]).view(len(tables), width),
        ints(q_start),
        ints(q_len),
        ints(ctx),
        num_decode,
        tile_tokens=tile_tokens,
    )
    if tiles:  # a decode-only step (most steps) copies no tile arrays to the device
        batch.tile_seg = ints([s for s, _ in tiles])
        batch.tile_q0 = ints([q0 for _, q0 in tiles])
    return batch


def attend(
    q: torch.Tensor,  # (T, nh, hd)
    k_cache: torch.Tensor,  # (nkv, num_blocks, bs, hd)
    v_cache: torch.Tensor,
    batch: TritonBatch,
    scale: float,
) -> torch.Tensor:  # (T, nh, hd)
    q = q if q.stride(2) == 1 else q.contiguous()
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    if batch.num_decode:
        _launch(q, k_cache, v_cache, out, batch, scale, batch.num_decode, decode=True)
    if batch.tile_seg is not None:
        _launch(q, k_cache, v_cache, out, batch, scale, batch.tile_seg.numel(), decode=False)
    return out


def constants(
    dtype: torch.dtype, group: int, hd: int, decode: bool, tile_tokens: int, codes: int = 0
) -> dict:
    """The kernel's compile-time parameters for one launch."""
    if decode:  # one token: its query heads padded up to tl.dot's smallest M
        g_pad, tokens = max(DECODE_ROWS, _pow2(group)), 1
    else:
        g_pad, tokens = _pow2(group), tile_tokens
    return dict(
        G=group,
        G_PAD=g_pad,
        BLOCK_Q=tokens,
        BLOCK_N=max(16, BLOCK_N >> _halvings(dtype, hd)),
        HD=hd,
        HD_PAD=max(16, _pow2(hd)),
        DECODE=decode,
        PRECISION="ieee" if dtype == torch.float32 else "tf32",
        CODES=codes,
    )


def _launch(q, k_cache, v_cache, out, b: TritonBatch, scale, tiles: int, decode: bool) -> None:
    from jobrunner.engine.paged.triton_kernel import paged_attention_kernel

    k, k_scale, codes = _parts(k_cache)
    v, v_scale, _ = _parts(v_cache)
    assert v.stride() == k.stride() and q.stride(2) == out.stride(2) == 1
    if k_scale is None:  # unread: any pointer will do
        k_scale = v_scale = k
    assert v_scale.stride() == k_scale.stride()
    tile_seg = b.q_start if decode else b.tile_seg  # unread by decode launches
    tile_q0 = b.q_start if decode else b.tile_q0
    group = q.shape[1] // k.shape[0]
    paged_attention_kernel[(tiles, k.shape[0])](
        q,
        k,
        v,
        k_scale,
        v_scale,
        out,
        b.tables,
        b.q_start,
        b.q_len,
        b.ctx,
        tile_seg,
        tile_q0,
        scale,
        k.shape[2],
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        k.stride(0),
        k.stride(1),
        k.stride(2),
        k_scale.stride(0),
        k_scale.stride(1),
        k_scale.stride(2),
        b.tables.stride(0),
        **constants(q.dtype, group, q.shape[2], decode, b.tile_tokens, codes),
        enable_fp_fusion=True,  # explicit: Triton 3.9 warns that its default will change
    )


def self_check(
    device: torch.device, dtype: torch.dtype, cache, nh: int, nkv: int, hd: int
) -> str | None:
    """Run the kernel once on a small mixed step, over caches of the same kind as `cache`,
    against plain attention on the device: None when it agrees, else why not (the runner then
    keeps the torch path). A kernel that fails to compile or miscomputes on a GPU the tests
    never ran on costs a log line, not the job (a fault that leaves the CUDA context unusable
    still ends it)."""
    g = torch.Generator(device="cpu").manual_seed(0)
    bs, blocks = 16, 4
    pair, dense = [], []
    for _ in range(2):
        values = torch.randn(nkv, blocks, bs, hd, generator=g)
        made, seen = like(cache, values, dtype, device)
        pair.append(made)
        dense.append(seen.float())
    # one decode row over 40 positions (blocks 2, 0, 3), one 20-token chunk behind 10 (1, 2)
    tables, q_len, ctx = [[2, 0, 3], [1, 2]], [1, 20], [40, 30]
    q = torch.randn(21, nh, hd, generator=g).to(device, dtype)
    tokens = prefill_tokens(nh // nkv, dtype, hd)
    batch = build_batch(tables, [0, 1], q_len, ctx, 1, tokens, device)
    try:
        got = attend(q, *pair, batch, hd**-0.5).float()
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # a fault while running surfaces here, not later
    except Exception as e:  # compile, launch or run failure
        return f"{type(e).__name__}: {e}"
    if not torch.isfinite(got).all():
        return "non-finite output"
    worst = 0.0
    for table, start, n, L in zip(tables, [0, 1], q_len, ctx, strict=True):
        k, v = (x[:, table].reshape(nkv, -1, hd)[:, :L] for x in dense)
        k, v = k.repeat_interleave(nh // nkv, 0), v.repeat_interleave(nh // nkv, 0)
        s = q[start : start + n].float().transpose(0, 1) @ k.transpose(1, 2) * hd**-0.5
        future = (
            torch.arange(L, device=device)[None] > torch.arange(L - n, L, device=device)[:, None]
        )
        want = (torch.softmax(s.masked_fill(future, float("-inf")), -1) @ v).transpose(0, 1)
        worst = max(worst, (got[start : start + n] - want).abs().max().item())
    limit = 1e-4 if dtype == torch.float32 else 5e-2
    return None if worst <= limit else f"largest error {worst:.2e} against plain attention"


def like(cache, values: torch.Tensor, dtype: torch.dtype, device: torch.device):
    """`values` (nkv, blocks, bs, hd) stored as `cache` stores them: (the new cache, what the
    kernel should read back, dequantized)."""
    if isinstance(cache, torch.Tensor):
        made = values.to(device, cache.dtype)
        return made, made
    made = type(cache)(cache.fmt, values.shape, dtype, device)
    nkv, blocks, bs, hd = values.shape
    slots = torch.arange(blocks * bs, device=device)
    made.write(slots, values.to(device).view(nkv, -1, hd).transpose(0, 1))
    seen = made.gather(torch.arange(blocks, device=device)).view(values.shape)
    return made, seen
