"""Paged attention over a flat slot-indexed KV cache, for batches mixing prefill and decode.

Token rows of a step are laid out as [decode rows, sorted by context length][prefill chunks].

On CUDA, one Triton kernel (triton_attention.py) attends every row in place in the paged cache:
decode rows and prompt chunks alike, no gather, no mask.

On CPU, native kernels (engine/paged/cpu_kernels.py) attend in place in the paged cache: decode
rows in one group with no padding and no gather, and, where the head layout suits the prefill
kernel, each prefill chunk to its cached context and to its own K/V rows (written just before),
causal, with no mask.

Elsewhere decode rows are attended in a few groups, each gathered and padded to its longest
context, with the query heads of one KV head folded into the query axis (GQA without copying
K/V). A prefill chunk starting at position 0 attends to its own fresh K/V (causal). A later
chunk, or one after a prefix-cache hit, gathers the context before it from the cache: on CPU it
attends to that and to its own keys in two flash passes merged by log-sum-exp, elsewhere to the
whole context under an offset causal mask.

The metadata is built once per step and shared by every layer.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from jobrunner.engine.paged import cpu_kernels, triton_attention
from jobrunner.engine.paged.cache_dtype import to_cache_dtype


@dataclass
class DecodeGroup:
    start: int  # first token row
    end: int
    block_tables: torch.Tensor  # (b, nb) block ids of each row's context (padding -> block 0)
    context_lens: torch.Tensor  # (b,) positions each row attends to
    mask: torch.Tensor | None  # (b, 1, 1, nb * bs) True where the position is real; None: kernel


@dataclass
class PrefillChunk:
    start: int  # first token row
    end: int
    block_ids: torch.Tensor | None  # (nb,) context blocks; None when the chunk starts at 0
    # (except under the prefill kernel, which reads every position from the cache)
    context_len: int  # L: positions attended by the chunk's last token
    mask: torch.Tensor | None  # (n, L) offset causal mask; None: no cached context, or on CPU


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # (T,) where each new token's K/V is written
    decode_groups: list[DecodeGroup] = field(default_factory=list)
    prefills: list[PrefillChunk] = field(default_factory=list)
    kernel_writes: bool = False  # the caches are CPU caches the native kernels handle
    prefill_kernel: bool = False  # prefill chunks attend in place (cpu_kernels.paged_prefill)
    triton: triton_attention.TritonBatch | None = None  # CUDA: every row through the kernel


def group_by_length(
    context_lens: list[int], max_ratio: float = 1.5, min_size: int = 8
) -> list[tuple[int, int]]:
    """Split rows sorted by context length into runs whose padding stays bounded."""
    groups, start = [], 0
    for i in range(1, len(context_lens) + 1):
        end_run = i == len(context_lens) or (
            i - start >= min_size and context_lens[i] > max_ratio * context_lens[start]
        )
        if end_run:
            groups.append((start, i))
            start = i
    return groups


def paged_attention(
    q: torch.Tensor,  # (T, nh, hd)
    k: torch.Tensor,  # (T, nkv, hd)
    v: torch.Tensor,  # (T, nkv, hd)
    k_cache: torch.Tensor,  # (nkv, num_blocks, bs, hd)
    v_cache: torch.Tensor,  # (nkv, num_blocks, bs, hd)
    meta: AttentionMetadata,
    scale: float,
    written: bool = False,  # the new K/V are in the cache already (cpu_kernels.rope_kv_write_)
    rows: list[int] | None = None,  # sorted token rows whose outputs are read; None: all
) -> torch.Tensor:  # (T, nh * hd); under the CPU prefill kernel, rows not in `rows` unset
    if not written:
        _write_new(k, v, k_cache, v_cache, meta)
    if meta.triton is not None:
        return triton_attention.attend(q, k_cache, v_cache, meta.triton, scale).view(q.shape[0], -1)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if meta.prefills and not meta.prefill_kernel:  # a chunk's own keys as every path reads them
        k, v = _as_cached(k_cache, meta.slot_mapping, k), _as_cached(v_cache, meta.slot_mapping, v)
    for g in meta.decode_groups:
        out[g.start : g.end] = _decode(q[g.start : g.end], k_cache, v_cache, g, scale)
    for p in meta.prefills:
        if meta.prefill_kernel:
            for a, b in _wanted_spans(p, rows):
                past = p.context_len - (p.end - a)  # the position of row a
                qp, op = q[a:b], out[a:b]
                got = cpu_kernels.paged_prefill(qp, k_cache, v_cache, p.block_ids, past, scale, op)
                if got is not op:  # not float32: written elsewhere
                    op.copy_(got)
        else:
            out[p.start : p.end] = _prefill(q, k, v, k_cache, v_cache, p, scale)
    return out.view(q.shape[0], -1)


def _wanted_spans(p: PrefillChunk, rows: list[int] | None) -> list[tuple[int, int]]:
    """The chunk's token rows to attend for: all of them, or each wanted one alone (a 1-row
    chunk at its own position reads the context the whole chunk's row would)."""
    if rows is None:
        return [(p.start, p.end)]
    lo, hi = bisect.bisect_left(rows, p.start), bisect.bisect_left(rows, p.end)
    return [(r, r + 1) for r in rows[lo:hi]]


def _write_new(k, v, k_cache, v_cache, meta: AttentionMetadata) -> None:
    """The step's new K/V rows into their slots."""
    if meta.kernel_writes:
        cpu_kernels.write_kv_(k_cache, v_cache, meta.slot_mapping, k, v)
    else:
        _write(k_cache, meta.slot_mapping, k)
        _write(v_cache, meta.slot_mapping, v)


def _write(cache, slot_mapping: torch.Tensor, x: torch.Tensor) -> None:
    """x (T, nkv, hd) into the flat slots; a quantized cache (engine/quant/kv.py) quantizes."""
    if not isinstance(cache, torch.Tensor):
        return cache.write(slot_mapping, x)
    nkv, _, _, hd = cache.shape
    cache.view(nkv, -1, hd).index_copy_(
        1, slot_mapping, to_cache_dtype(x, cache.dtype).transpose(0, 1)
    )


def _as_cached(cache, slot_mapping: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """x (T, nkv, hd) as the cache holds it: rounded to a 16-bit cache's dtype, or read back
    from an 8-bit one as codes x scales. The kernels read a prompt chunk's own keys from the
    cache, so the torch path attends to the same values (and a row's tokens do not depend on
    the path that ran it)."""
    if not isinstance(cache, torch.Tensor):
        return cache.read(slot_mapping).to(x.dtype)
    return to_cache_dtype(x, cache.dtype).to(x.dtype) if cache.dtype != x.dtype else x


def _gather(cache: torch.Tensor, block_ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(nkv, num_blocks, bs, hd)[block_ids (..., nb)] -> (..., nkv, nb * bs, hd) in `dtype` (the
    compute dtype, which a 16-bit cache under a float32 model is converted to), one copy."""
    if not isinstance(cache, torch.Tensor):  # quantized: dequantized to the compute dtype
        return cache.gather(block_ids)
    nkv, _, bs, hd = cache.shape
    *lead, nb = block_ids.shape
    # index_select on the flat ids is several times cheaper than advanced indexing on dim 1
    g = torch.index_select(cache, 1, block_ids.reshape(-1))  # (nkv, prod(lead) * nb, bs, hd)
    g = g.view(nkv, *lead, nb * bs, hd).to(dtype)
    return g.movedim(0, -3)  # (..., nkv, nb * bs, hd): a view


def _decode(q, k_cache, v_cache, g: DecodeGroup, scale: float) -> torch.Tensor:
    if g.mask is None:  # the runner checked cpu_kernels.supports(cache)
        return cpu_kernels.paged_decode(q, k_cache, v_cache, g.block_tables, g.context_lens, scale)
    b, nh, hd = q.shape
    nkv = k_cache.shape[0]
    qg = q.view(b, nkv, nh // nkv, hd)  # (b, nkv, group, hd): query heads of one KV head
    kg = _gather(k_cache, g.block_tables, q.dtype)  # (b, nkv, L, hd)
    vg = _gather(v_cache, g.block_tables, q.dtype)
    g.mask = _additive(g.mask, q.dtype)
    o = F.scaled_dot_product_attention(qg, kg, vg, attn_mask=g.mask, scale=scale)
    return o.reshape(b, nh, hd)


def _prefill(q, k, v, k_cache, v_cache, p: PrefillChunk, scale: float) -> torch.Tensor:
    qp = q[p.start : p.end].transpose(0, 1).unsqueeze(0)  # (1, nh, n, hd)
    if p.block_ids is not None and p.mask is None:
        return _prefill_split(
            qp, k[p.start : p.end], v[p.start : p.end], k_cache, v_cache, p, scale
        )
    if p.block_ids is None:
        kp = k[p.start : p.end].transpose(0, 1)  # (nkv, n, hd)
        vp = v[p.start : p.end].transpose(0, 1)
    else:
        kp = _gather(k_cache, p.block_ids, q.dtype)[:, : p.context_len]  # (nkv, L, hd)
        vp = _gather(v_cache, p.block_ids, q.dtype)[:, : p.context_len]
    p.mask = _additive(p.mask, q.dtype)
    o = F.scaled_dot_product_attention(
        qp,
        kp.unsqueeze(0),
        vp.unsqueeze(0),
        attn_mask=p.mask,
        is_causal=p.block_ids is None,
        scale=scale,
        enable_gqa=True,
    )  # (1, nh, n, hd)
    return o[0].transpose(0, 1)


def _prefill_split(qp, k_new, v_new, k_cache, v_cache, p: PrefillChunk, scale: float):
    """CPU: a chunk after cached context as two flash passes, the context before the chunk (no
    mask) and the chunk's own keys (causal, skipping the masked half), merged by their
    log-sum-exps. One masked pass over the whole context computes every masked score too:
    1.7x slower for a 2,000-token chunk behind a 32-token cached head."""
    _, nh, n, hd = qp.shape
    nkv = k_new.shape[1]
    past = p.context_len - n  # cached positions before the chunk
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    # unmasked, so the query heads of one KV head can share it as one longer query (no K/V copy)
    q_fold = qp.reshape(1, nkv, nh // nkv * n, hd)
    k_past = _gather(k_cache, p.block_ids, qp.dtype)[:, :past].unsqueeze(0)  # (1, nkv, past, hd)
    v_past = _gather(v_cache, p.block_ids, qp.dtype)[:, :past].unsqueeze(0)
    o1, lse1 = flash(q_fold, k_past, v_past, 0.0, False, scale=scale)
    k_own = k_new.transpose(0, 1).repeat_interleave(nh // nkv, dim=0).unsqueeze(0)  # (1, nh, n, hd)
    v_own = v_new.transpose(0, 1).repeat_interleave(nh // nkv, dim=0).unsqueeze(0)
    o2, lse2 = flash(qp, k_own, v_own, 0.0, True, scale=scale)
    o1, lse1 = o1.reshape(1, nh, n, hd), lse1.reshape(1, nh, n)
    lse = torch.logaddexp(lse1, lse2)  # (1, nh, n)
    o = o1 * (lse1 - lse).exp_().unsqueeze(-1) + o2 * (lse2 - lse).exp_().unsqueeze(-1)
    return o[0].transpose(0, 1)  # (n, nh, hd)


def _additive(mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """A boolean mask as the 0 / -inf float mask SDPA would build from it, built once per step
    (the metadata keeps it) instead of once per layer."""
    if mask is None or mask.dtype != torch.bool:
        return mask
    return torch.zeros_like(mask, dtype=dtype).masked_fill_(mask.logical_not(), float("-inf"))
