"""Prefill attention behind cached context: the CPU split (two flash passes merged by
log-sum-exp) against one pass under the offset causal mask."""

from __future__ import annotations

import pytest
import torch

from jobrunner.engine.paged.attention import PrefillChunk, _prefill


@pytest.mark.parametrize("past,n", [(16, 1), (32, 70), (200, 33)])
def test_split_prefill_equals_the_masked_pass(past, n):
    g = torch.Generator().manual_seed(4)
    nh, nkv, hd, bs, num_blocks = 6, 2, 64, 16, 40
    L = past + n
    blocks = torch.randperm(num_blocks, generator=g)[: -(-L // bs)]
    k_cache = torch.randn(nkv, num_blocks, bs, hd, generator=g)
    v_cache = torch.randn(nkv, num_blocks, bs, hd, generator=g)
    slots = (blocks[:, None] * bs + torch.arange(bs)).reshape(-1)[past:L]  # the chunk's own slots
    q = torch.randn(n, nh, hd, generator=g)
    k = k_cache.view(nkv, -1, hd)[:, slots].transpose(0, 1)  # (n, nkv, hd), already written
    v = v_cache.view(nkv, -1, hd)[:, slots].transpose(0, 1)
    mask = torch.arange(L)[None] <= torch.arange(past, L)[:, None]
    masked = _prefill(q, k, v, k_cache, v_cache, PrefillChunk(0, n, blocks, L, mask), 0.125)
    split = _prefill(q, k, v, k_cache, v_cache, PrefillChunk(0, n, blocks, L, None), 0.125)
    assert split.shape == (n, nh, hd)
    torch.testing.assert_close(split, masked, atol=2e-6, rtol=2e-6)
