"""Decode steps replayed from captured CUDA graphs: one launch per step instead of hundreds.

A decode-only step of n rows runs the graph captured for the smallest bucket size >= n. Every
graph reads the same static buffers (token ids, positions, cache slots, block tables, context
lengths), which a step fills before the replay. The rows past n are padding: position 0, one
token of context, and their K/V written to the cache's scratch block, which the block manager
never hands out, so they touch no live row. The attention is the Triton kernel
(triton_attention.py), whose decode launch has a fixed grid for a fixed row count.

Graphs are captured at start-up, largest first, sharing one memory pool. Off CUDA the same code
runs with `EagerGraph` in place of a capture: each replay calls the step again on the static
buffers, which is how the tests check the buffers and the padding without a GPU.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch

from jobrunner.engine.paged.attention import AttentionMetadata
from jobrunner.engine.paged.kv_cache import KVCache
from jobrunner.engine.paged.triton_attention import TritonBatch

log = logging.getLogger(__name__)

MAX_GRAPH_ROWS = 512  # larger decode steps run eagerly (their launches are a small share)


def bucket_sizes(max_rows: int) -> list[int]:
    """1, 2, 4, 8, then every multiple of 16 up to max_rows (padding stays under 16 rows)."""
    sizes = [s for s in (1, 2, 4, 8) if s < max_rows]
    sizes += range(16, max_rows, 16)
    return [*sizes, max_rows]


class CudaGraph:
    """fn captured once (after a warm-up run on a side stream); calling replays it."""

    def __init__(self, fn: Callable[[], torch.Tensor], pool) -> None:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn()  # Triton compiles and the allocator warms up outside the capture
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        # thread_local: the reader and writer threads never touch CUDA, but a capture must not
        # fail on what another thread does
        with torch.cuda.graph(self.graph, pool=pool, capture_error_mode="thread_local"):
            self.out = fn()

    def __call__(self) -> torch.Tensor:
        self.graph.replay()
        return self.out


class EagerGraph:
    """Stands in for a capture off CUDA: replaying runs fn again over the same buffers."""

    def __init__(self, fn: Callable[[], torch.Tensor], pool) -> None:
        self.fn = fn

    def __call__(self) -> torch.Tensor:
        return self.fn()


class DecodeGraphs:
    def __init__(self, model, kv: KVCache, device: torch.device, max_rows: int, max_len: int):
        self.model, self.kv = model, kv
        self.sizes = bucket_sizes(min(max_rows, MAX_GRAPH_ROWS))
        n, width = self.sizes[-1], -(-max_len // kv.block_size)

        def zeros(*shape, dtype=torch.long):
            return torch.zeros(shape, dtype=dtype, device=device)

        self.ids, self.pos, self.slots = zeros(n), zeros(n), zeros(n)
        self.tables = zeros(n, width, dtype=torch.int32)
        self.ctx = zeros(n, dtype=torch.int32)
        self.q_start = torch.arange(n, dtype=torch.int32, device=device)
        self.q_len = torch.ones(n, dtype=torch.int32, device=device)
        self.rows = torch.arange(n, device=device)
        head = model.hf.lm_head
        vocab = getattr(head, "out_features", None) or model.hf.config.vocab_size
        # every graph writes its logits here: one (rows, vocab) buffer, not one per size
        self.logits = torch.empty(n, vocab, dtype=torch.float32, device=device)
        self.graphs: dict[int, Callable[[], torch.Tensor]] = {}

    @property
    def max_rows(self) -> int:
        return self.sizes[-1]

    def capture(self, graph_type=None) -> None:
        graph_type = graph_type or (CudaGraph if self.ids.is_cuda else EagerGraph)
        t = time.perf_counter()
        pool = torch.cuda.graph_pool_handle() if graph_type is CudaGraph else None
        self._pad(0, self.max_rows)  # capture over valid padding rows
        for size in reversed(self.sizes):
            self.graphs[size] = graph_type(lambda size=size: self._forward(size), pool)
        log.info(
            "captured %d decode graphs (1 to %d rows) in %.1f s",
            len(self.graphs),
            self.max_rows,
            time.perf_counter() - t,
        )

    def _forward(self, size: int) -> torch.Tensor:
        batch = TritonBatch(
            self.tables[:size], self.q_start[:size], self.q_len[:size], self.ctx[:size], size
        )
        meta = AttentionMetadata(self.slots[:size], triton=batch)
        logits = self.model.forward(
            self.ids[:size], self.pos[:size], meta, self.kv.layers, self.rows[:size]
        )
        return self.logits[:size].copy_(logits)

    def run(self, ids, positions, slots, batch: TritonBatch) -> torch.Tensor:  # (n, vocab)
        """A decode-only step of n <= max_rows rows (tensors as the runner built them). The
        logits are a view of the shared buffer: valid until the next replay, so they must be
        consumed (sampled) before the next step runs."""
        n = ids.shape[0]
        size = next(s for s in self.sizes if s >= n)
        self.ids[:n].copy_(ids)
        self.pos[:n].copy_(positions)
        self.slots[:n].copy_(slots)
        self.ctx[:n].copy_(batch.ctx)
        self.tables[:n, : batch.tables.shape[1]].copy_(batch.tables)
        self._pad(n, size)
        return self.graphs[size]()[:n]

    def _pad(self, start: int, end: int) -> None:
        """Rows start..end-1 as padding: position 0 of the scratch block."""
        scratch = self.kv.scratch_block
        self.ids[start:end] = 0
        self.pos[start:end] = 0
        self.slots[start:end] = scratch * self.kv.block_size
        self.ctx[start:end] = 1
        self.tables[start:end, 0] = scratch
