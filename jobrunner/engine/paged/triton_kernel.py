"""The Triton paged attention kernel (imports triton; loaded only by triton_attention.py).

One program attends one tile of a sequence's new tokens for one KV head: BLOCK_Q tokens times
the G query heads that share the head, as the M = BLOCK_Q x G_PAD rows of one matrix, so GQA
reads each K/V row once for all of its query heads. An 8-bit cache (int8 or fp8 codes with a
float16 scale per row) is dequantized as it loads. Keys stream in BLOCK_N positions at a time,
each position's row found through the sequence's block table, with an online softmax; a key
counts where it is before the context's end and not after the query's own position, so decode
rows, prompt chunks and chunks behind cached context are one code path.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def paged_attention_kernel(
    Q,  # (T, nh, hd)
    K,  # (nkv, num_blocks, bs, hd); V has the same strides
    V,
    K_scale,  # (nkv, num_blocks, bs, 1) float16 per-row scales of 8-bit codes (unread if CODES=0)
    V_scale,
    Out,  # (T, nh, hd)
    tables,  # (S, W) int32: block ids of each sequence's context
    seg_q_start,  # (S,) int32: first token row of each sequence's new tokens
    seg_q_len,  # (S,) int32: its new tokens
    seg_ctx,  # (S,) int32: positions its last new token attends to (cached + new)
    tile_seg,  # (tiles,) int32: the sequence of each tile (unused when DECODE)
    tile_q0,  # (tiles,) int32: the tile's first new token within its sequence
    scale,
    block_size,
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_kh,
    stride_kb,
    stride_ks,
    stride_sh,  # the scales' strides (head, block, slot)
    stride_sb,
    stride_ss,
    stride_tab,
    G: tl.constexpr,  # query heads per KV head
    G_PAD: tl.constexpr,  # G rounded up to a power of two
    BLOCK_Q: tl.constexpr,  # new tokens per tile
    BLOCK_N: tl.constexpr,  # keys per inner step
    HD: tl.constexpr,
    HD_PAD: tl.constexpr,
    DECODE: tl.constexpr,  # one new token per sequence, tile i = sequence i
    PRECISION: tl.constexpr,  # tl.dot input precision: "ieee" keeps float32 exact
    CODES: tl.constexpr,  # 0: K/V values; 1: int8 codes x scale; 2: fp8 (e4m3) codes x scale
):
    tile = tl.program_id(0)
    kvh = tl.program_id(1)
    if DECODE:
        s = tile
        q0 = 0
    else:
        s = tl.load(tile_seg + tile)
        q0 = tl.load(tile_q0 + tile)
    q_start = tl.load(seg_q_start + s)
    q_len = tl.load(seg_q_len + s)
    ctx = tl.load(seg_ctx + s)
    past = ctx - q_len

    r = tl.arange(0, BLOCK_Q * G_PAD)
    tok = q0 + r // G_PAD
    head = kvh * G + r % G_PAD
    row_ok = (tok < q_len) & (r % G_PAD < G)
    d = tl.arange(0, HD_PAD)
    d_ok = d < HD
    q_rows = (q_start + tok).to(tl.int64)
    q = tl.load(
        Q + q_rows[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :],
        mask=row_ok[:, None] & d_ok[None, :],
        other=0.0,
    )
    q_pos = past + tok

    m_i = tl.full((BLOCK_Q * G_PAD,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_Q * G_PAD,), tl.float32)
    acc = tl.zeros((BLOCK_Q * G_PAD, HD_PAD), tl.float32)
    end = tl.minimum(ctx, past + q0 + BLOCK_Q)  # past the tile's last token nothing counts
    table = tables + s.to(tl.int64) * stride_tab
    head_base = kvh.to(tl.int64) * stride_kh
    for n0 in range(0, end, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)
        pos_ok = pos < end
        blk = tl.load(table + pos // block_size, mask=pos_ok, other=0).to(tl.int64)
        row = head_base + blk * stride_kb + (pos % block_size) * stride_ks  # (BLOCK_N,)
        kv_mask = pos_ok[:, None] & d_ok[None, :]
        k = tl.load(K + row[:, None] + d[None, :], mask=kv_mask, other=0)
        v = tl.load(V + row[:, None] + d[None, :], mask=kv_mask, other=0)
        if CODES != 0:  # 8-bit codes (stored as bytes) times their row's scale
            s_row = kvh * stride_sh + blk * stride_sb + (pos % block_size) * stride_ss
            k_s = tl.load(K_scale + s_row, mask=pos_ok, other=0.0).to(tl.float32)
            v_s = tl.load(V_scale + s_row, mask=pos_ok, other=0.0).to(tl.float32)
            code_type = tl.int8 if CODES == 1 else tl.float8e4nv
            k = k.to(code_type, bitcast=True).to(tl.float32) * k_s[:, None]
            v = v.to(code_type, bitcast=True).to(tl.float32) * v_s[:, None]
        k = k.to(q.dtype)
        v = v.to(q.dtype)
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale  # (M, BLOCK_N)
        visible = pos_ok[None, :] & (pos[None, :] <= q_pos[:, None])
        scores = tl.where(visible, scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows that see nothing yet
        p = tl.exp(scores - m_safe[:, None])
        alpha = tl.exp(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new
    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    tl.store(
        Out + q_rows[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :],
        out.to(Out.dtype.element_ty),
        mask=row_ok[:, None] & d_ok[None, :],
    )
