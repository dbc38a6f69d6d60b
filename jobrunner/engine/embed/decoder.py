"""Decoder models as embedders: the paged engine's own prefill, no decode, no sampling.

A batch's sequences are packed into one step (T tokens) as prefill chunks starting at position 0,
each over fresh blocks of a cache sized for one batch; the final-normed hidden states are pooled
(last token for decoder embedders). The same kernels as generation run: the CPU prefill kernel,
else torch's SDPA.
"""

from __future__ import annotations

from typing import Any

import torch

from jobrunner.engine.embed.pooling import pool
from jobrunner.engine.paged import cpu_kernels
from jobrunner.engine.paged.attention import AttentionMetadata, PrefillChunk
from jobrunner.engine.paged.kv_cache import allocate_kv_cache
from jobrunner.engine.paged.model import PagedCausalLM


def blocks_for(n: int, block_size: int) -> int:
    return -(-n // block_size)


class PagedPrefill:
    """Embeds batches of up to `max_tokens` block-rounded tokens (one sequence may be longer,
    up to `max_len`) with the paged model's prefill."""

    def __init__(self, hf_model: Any, max_tokens: int, max_len: int, block_size: int) -> None:
        self.model = PagedCausalLM(hf_model, max_len)
        self.device = next(hf_model.parameters()).device
        self.block_size = block_size
        num_blocks = blocks_for(max(max_tokens, max_len), block_size) + 1
        m = self.model
        self.kv = allocate_kv_cache(
            len(m.layers), m.num_kv_heads, m.head_dim, num_blocks, block_size, m.dtype, self.device
        )
        cache = self.kv.layers[0][0]
        self.kernel_writes = cpu_kernels.supports(cache)
        self.prefill_kernel = self.kernel_writes and cpu_kernels.prefill_supported(
            m.num_heads, m.num_kv_heads, m.head_dim
        )

    def embed(self, seqs: list[list[int]], mode: str) -> torch.Tensor:  # (B, D) float32
        lens = [len(s) for s in seqs]
        ids = torch.tensor([t for s in seqs for t in s], device=self.device)  # (T,)
        pos = torch.cat([torch.arange(n, device=self.device) for n in lens])  # (T,)
        meta = self._metadata(lens)
        rows = None if mode == "mean" else self._pooled_rows(lens, mode)
        h = self.model.hidden_states(ids, pos, meta, self.kv.layers, rows)
        if rows is not None:
            return h.float()
        return pool(h, lens, mode)

    def _pooled_rows(self, lens: list[int], mode: str) -> torch.Tensor:
        ends = torch.tensor(lens, device=self.device).cumsum(0)
        return ends - 1 if mode == "last" else ends - torch.tensor(lens, device=self.device)

    def _metadata(self, lens: list[int]) -> AttentionMetadata:
        bs, slots, chunks, row, block = self.block_size, [], [], 0, 0
        for n in lens:
            nb = blocks_for(n, bs)
            table = list(range(block, block + nb))
            slots += [table[p // bs] * bs + p % bs for p in range(n)]
            blocks = torch.tensor(table, device=self.device) if self.prefill_kernel else None
            chunks.append(PrefillChunk(row, row + n, blocks, n, None))
            row, block = row + n, block + nb
        return AttentionMetadata(
            torch.tensor(slots, device=self.device),
            prefills=chunks,
            kernel_writes=self.kernel_writes,
            prefill_kernel=self.prefill_kernel,
        )
