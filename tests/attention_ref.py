"""Plain attention over a paged cache (float64 prefill, float32 decode): the references the
attention kernels are held to."""

from __future__ import annotations

import torch


def reference_prefill(q, k_cache, v_cache, block_ids, start, scale):
    """A chunk of n new tokens after `start` cached positions: its context gathered block by
    block, float64 softmax attention, causal. q (n, nh, hd); caches (nkv, blocks, bs, hd)."""
    n, nh, hd = q.shape
    nkv, _, bs, _ = k_cache.shape
    L = start + n
    k = k_cache[:, block_ids].reshape(nkv, -1, hd)[:, :L].double()  # (nkv, L, hd)
    v = v_cache[:, block_ids].reshape(nkv, -1, hd)[:, :L].double()
    k, v = k.repeat_interleave(nh // nkv, 0), v.repeat_interleave(nh // nkv, 0)
    s = q.double().transpose(0, 1) @ k.transpose(1, 2) * scale  # (nh, n, L)
    future = (
        torch.arange(L, device=q.device)[None] > (start + torch.arange(n, device=q.device))[:, None]
    )
    w = torch.softmax(s.masked_fill(future, float("-inf")), dim=-1)
    return (w @ v).transpose(0, 1).float()  # (n, nh, hd)


def reference_decode(q, k_cache, v_cache, tables, lens, scale):
    """Each row on its own: its context gathered block by block, plain softmax attention."""
    nkv, _, bs, hd = k_cache.shape
    out = []
    for r in range(q.shape[0]):
        L = int(lens[r])
        blocks = tables[r, : -(-L // bs)]
        k = k_cache[:, blocks].reshape(nkv, -1, hd)[:, :L].float()  # (nkv, L, hd)
        v = v_cache[:, blocks].reshape(nkv, -1, hd)[:, :L].float()
        qr = q[r].float().view(nkv, -1, hd)  # (nkv, group, hd)
        w = torch.softmax(qr @ k.transpose(1, 2) * scale, dim=-1)
        out.append((w @ v).reshape(-1, hd))
    return torch.stack(out)
