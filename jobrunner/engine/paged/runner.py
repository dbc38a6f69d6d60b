"""Turns a ScheduledBatch into tensors, runs the model, samples one token per finishing row."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from jobrunner.engine.paged import cpu_kernels, triton_attention
from jobrunner.engine.paged.attention import (
    AttentionMetadata,
    DecodeGroup,
    PrefillChunk,
    group_by_length,
)
from jobrunner.engine.paged.cuda_graphs import DecodeGraphs
from jobrunner.engine.paged.kv_cache import KVCache
from jobrunner.engine.paged.model import PagedCausalLM
from jobrunner.engine.sampler import sample
from jobrunner.sched.batch import ScheduledBatch
from jobrunner.sched.draft import accept

log = logging.getLogger(__name__)

# Without the prefill kernel (cpu_kernels.paged_prefill), a chunk behind cached context attends
# in two flash passes merged by log-sum-exp on CPU once it has this many (query, key) scores;
# below that, one masked pass is cheaper (2 cores, SmolLM2 heads: 220 tokens behind 32, 0.9 ms
# masked against 2.5 ms split; 2,000 behind 32, 52 against 32 ms; 1,000 behind 1,000, 24
# against 20 ms).
SPLIT_PREFILL_SCORES = 1 << 19


@dataclass
class StepInputs:
    input_ids: torch.Tensor  # (T,)
    positions: torch.Tensor  # (T,)
    meta: AttentionMetadata
    logits_rows: torch.Tensor  # (R,) token row of each sampling batch row's last token
    sampling_rows: list[int]  # batch row of each logits row


class ModelRunner:
    def __init__(
        self,
        model: PagedCausalLM,
        kv: KVCache,
        device: torch.device,
        graph_rows: int = 0,
        max_len: int = 0,
    ):
        self.model = model
        self.kv = kv
        self.device = device
        if device.type == "cuda" and device.index is not None:
            torch.cuda.set_device(device)  # Triton and graph capture use the current device
        self.dtype = model.dtype
        # CUDA: every row through the Triton kernel; CPU: native kernels; else gather + SDPA
        self.triton = self._triton_usable(model, kv.layers[0][0], device, self.dtype)
        self.tile_tokens = triton_attention.prefill_tokens(  # prefill tile size of the kernel
            model.num_heads // model.num_kv_heads, self.dtype, model.head_dim
        )
        self.decode_kernel = not self.triton and cpu_kernels.supports(kv.layers[0][0])
        # prefill chunks read their context and themselves from the cache too (else SDPA)
        self.prefill_kernel = self.decode_kernel and cpu_kernels.prefill_supported(
            model.num_heads, model.num_kv_heads, model.head_dim
        )
        self.graphs = None  # decode steps of up to graph_rows rows replay captured graphs
        if self.triton and graph_rows and max_len:
            self.graphs = self._capture(graph_rows, max_len)
        log.info("paged attention: %s", self._describe())

    def _capture(self, rows: int, max_len: int) -> DecodeGraphs | None:
        graphs = DecodeGraphs(self.model, self.kv, self.device, rows, max_len)
        try:
            graphs.capture()
        except Exception as e:  # e.g. a quantized layer that syncs with the host
            if self.device.type == "cuda":  # a failed capture can leave its stream current
                torch.cuda.set_stream(torch.cuda.default_stream(self.device))
            log.warning(
                "CUDA graph capture failed (%s: %s): decode runs eagerly", type(e).__name__, e
            )
            return None
        return graphs

    @staticmethod
    def _triton_usable(model: PagedCausalLM, cache, device: torch.device, dtype) -> bool:
        heads = (model.num_heads, model.num_kv_heads, model.head_dim)
        if not (triton_attention.wanted(device) and triton_attention.supports(cache, *heads)):
            return False
        why = triton_attention.self_check(device, dtype, cache, *heads)
        if why:
            log.warning("Triton attention failed its start-up check (%s): torch path", why)
        return why is None

    def _describe(self) -> str:
        path = "native CPU kernels" if self.decode_kernel else "torch gather + SDPA"
        if self.triton:
            path = "Triton kernel"
        if self.graphs is not None:
            path += f", CUDA graphs for decode steps of up to {self.graphs.max_rows} rows"
        return path

    def run(self, batch: ScheduledBatch) -> tuple[list[list[int] | None], list[bool]]:
        """Tokens each batch row keeps (None where the row is mid-prompt; more than one where
        the model agreed with its drafts) and whether its logits were finite (False marks a
        row to fail; its tokens are meaningless)."""
        inputs = self.prepare(batch)
        logits = self._forward(inputs)  # (R, V)
        rows = [batch.seqs[i].sampler for i in inputs.sampling_rows]
        # processors run on the logits here; on CPU the argmax is ours (torch.max's, faster)
        sampled, finite, logprobs = sample(logits, rows, cpu_kernels.row_max)
        picks: dict[int, list[int]] = {}  # batch row -> its logits rows, in position order
        for j, row in enumerate(inputs.sampling_rows):
            picks.setdefault(row, []).append(j)
        tokens: list[list[int] | None] = [None] * len(batch)
        ok = [True] * len(batch)
        for row, js in picks.items():
            kept = accept(batch.drafts[row], [sampled[j] for j in js])
            tokens[row], ok[row] = kept, all(finite[j] for j in js[: len(kept)])
            if ok[row]:  # the row's processors (a grammar's matcher) follow its kept tokens
                batch.seqs[row].sampler.accept(kept, [logprobs[j] for j in js[: len(kept)]])
        return tokens, ok

    def copy_heads(self, copies: list[tuple[int, int, int]]) -> None:
        """Partial prefix hits (ScheduledBatch.copies): the first n tokens' K/V of each source
        block into its destination, every layer. All sources are read before any destination
        is written, as the scheduler's order of admissions needs."""
        if not copies:
            return
        bs, src, dst = self.kv.block_size, [], []
        for s, d, n in copies:
            src += range(s * bs, s * bs + n)
            dst += range(d * bs, d * bs + n)
        src_t, dst_t = self._tensor(src), self._tensor(dst)
        for pair in self.kv.layers:
            for cache in pair:
                for t in (
                    (cache,) if isinstance(cache, torch.Tensor) else (cache.codes, cache.scales)
                ):
                    flat = t.view(t.shape[0], -1, t.shape[-1])  # (nkv, slots, hd)
                    flat.index_copy_(1, dst_t, flat.index_select(1, src_t))

    def _forward(self, inputs: StepInputs) -> torch.Tensor:
        t, n = inputs.meta.triton, inputs.input_ids.shape[0]
        replay = (
            self.graphs is not None
            and t is not None
            and t.num_decode == n  # decode only: one token and one logits row per sequence
            and len(inputs.sampling_rows) == n
            and n <= self.graphs.max_rows
        )
        if replay:
            return self.graphs.run(inputs.input_ids, inputs.positions, inputs.meta.slot_mapping, t)
        return self.model.forward(
            inputs.input_ids, inputs.positions, inputs.meta, self.kv.layers, inputs.logits_rows
        )

    # ------------------------------------------------------------------ inputs

    def prepare(self, batch: ScheduledBatch) -> StepInputs:
        # under the CPU decode kernel a row with drafts attends as one decode query per token
        as_decode = [
            batch.is_decode(i) or bool(self.decode_kernel and batch.drafts[i])
            for i in range(len(batch))
        ]
        decode = sorted(
            (i for i in range(len(batch)) if as_decode[i]), key=lambda i: batch.start_positions[i]
        )
        prefill = [i for i in range(len(batch)) if not as_decode[i]]
        ids, pos, slots, logits_rows, sampling_rows, q_start = [], [], [], [], [], []
        for i in decode + prefill:
            seq, start, n = batch.seqs[i], batch.start_positions[i], batch.num_new_tokens[i]
            q_start.append(len(ids))
            ids += batch.input_tokens(i)
            pos += range(start, start + n)
            slots += self._slots(seq.block_table, start, n)
            if batch.samples(i):  # the last known token's position, then each draft's
                for back in range(len(batch.drafts[i]), -1, -1):
                    logits_rows.append(len(ids) - 1 - back)
                    sampling_rows.append(i)
        meta = AttentionMetadata(
            self._tensor(slots),
            kernel_writes=self.decode_kernel,
            prefill_kernel=self.prefill_kernel,
        )
        if self.triton:
            meta.triton = self._triton_batch(batch, decode + prefill, q_start, len(decode))
        else:
            meta.decode_groups = self._decode_groups(batch, decode)
            first = sum(batch.num_new_tokens[i] for i in decode)  # decode queries come first
            meta.prefills = self._prefill_chunks(batch, prefill, first_row=first)
        return StepInputs(
            self._tensor(ids), self._tensor(pos), meta, self._tensor(logits_rows), sampling_rows
        )

    def _slots(self, block_table: list[int], start: int, n: int) -> list[int]:
        bs = self.kv.block_size
        return [block_table[p // bs] * bs + p % bs for p in range(start, start + n)]

    def _tensor(self, values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=self.device)

    def _triton_batch(
        self, batch: ScheduledBatch, rows: list[int], q_start: list[int], num_decode: int
    ) -> triton_attention.TritonBatch:
        bs = self.kv.block_size
        ctx = [batch.start_positions[i] + batch.num_new_tokens[i] for i in rows]
        tables = [batch.seqs[i].block_table[: -(-L // bs)] for i, L in zip(rows, ctx, strict=True)]
        q_len = [batch.num_new_tokens[i] for i in rows]
        return triton_attention.build_batch(
            tables, q_start, q_len, ctx, num_decode, self.tile_tokens, self.device
        )

    def _decode_groups(self, batch: ScheduledBatch, rows: list[int]) -> list[DecodeGroup]:
        bs = self.kv.block_size
        if not rows:
            return []
        seqs, lens = [], []  # one query per token: a draft row's attend to their own positions
        for i in rows:
            for j in range(batch.num_new_tokens[i]):
                seqs.append(batch.seqs[i])
                lens.append(batch.start_positions[i] + j + 1)
        spans = [(0, len(lens))] if self.decode_kernel else group_by_length(lens)
        groups = []
        for a, b in spans:
            nb = -(-max(lens[a:b]) // bs)
            tables = [seq.block_table[:nb] for seq in seqs[a:b]]
            tables = self._tensor([t + [0] * (nb - len(t)) for t in tables])  # (b, nb)
            ctx = self._tensor(lens[a:b])  # (b,)
            mask = None
            if not self.decode_kernel:
                mask = torch.arange(nb * bs, device=self.device)[None] < ctx[:, None]  # (b, L)
                mask = mask[:, None, None, :]
            groups.append(DecodeGroup(a, b, tables, ctx, mask))
        return groups

    def _prefill_chunks(
        self, batch: ScheduledBatch, rows: list[int], first_row: int
    ) -> list[PrefillChunk]:
        bs, chunks, row = self.kv.block_size, [], first_row
        for i in rows:
            start, n = batch.start_positions[i], batch.num_new_tokens[i]
            if self.prefill_kernel:  # the whole context, causal, in place: no mask
                blocks = self._tensor(batch.seqs[i].block_table[: -(-(start + n) // bs)])
                chunks.append(PrefillChunk(row, row + n, blocks, start + n, None))
            elif start == 0:
                chunks.append(PrefillChunk(row, row + n, None, n, None))
            else:
                L = start + n
                blocks = self._tensor(batch.seqs[i].block_table[: -(-L // bs)])  # (nb,)
                chunks.append(PrefillChunk(row, row + n, blocks, L, self._offset_mask(start, L)))
            row += n
        return chunks

    def _offset_mask(self, start: int, L: int) -> torch.Tensor | None:
        """(n, L) causal mask of a chunk after `start` cached positions; None for a large chunk
        on CPU, where attention splits the chunk's context instead (attention._prefill_split)."""
        if self.device.type == "cpu" and (L - start) * L >= SPLIT_PREFILL_SCORES:
            return None
        q_pos = torch.arange(start, L, device=self.device)  # (n,)
        return torch.arange(L, device=self.device)[None] <= q_pos[:, None]
