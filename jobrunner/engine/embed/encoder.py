"""Encoder models (BERT family) over packed tokens: no padding goes through a linear layer.

A batch is the concatenation of its sequences (T, D), sorted by length. Embeddings,
projections, feed-forward and layer norms run on those T rows; attention is one call of the
native varlen kernel per layer on CPU in float32 (native.py: every sequence attends over itself
in the packed rows), else torch's SDPA once per run of sequences of one length, on a view of the
packed rows (no padding, no mask, no gather). Other encoders run as HF modules on length-sorted
padded batches (`PaddedEncoder`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from jobrunner.engine.embed import native
from jobrunner.engine.embed.pooling import pool

BERT_TYPES = ("bert",)


def packed_supported(hf_model: Any) -> bool:
    cfg = hf_model.config
    return (
        cfg.model_type in BERT_TYPES
        and getattr(cfg, "position_embedding_type", "absolute") == "absolute"
        and not getattr(cfg, "is_decoder", False)
        and hasattr(hf_model, "embeddings")
        and hasattr(hf_model, "encoder")
    )


class PackedBert:
    """BertModel's forward on packed sequences, using the HF modules' own weights."""

    thread_safe = True  # no state between calls: batches may run on several workers at once

    def __init__(self, hf_model: Any) -> None:
        cfg = hf_model.config
        self.hf = hf_model
        self.num_heads = cfg.num_attention_heads
        self.head_dim = cfg.hidden_size // self.num_heads
        self.device = next(hf_model.parameters()).device
        self.qkv = []  # per layer: the q, k, v projections as one (3D, D) weight
        for layer in hf_model.encoder.layer:
            s = layer.attention.self
            w = torch.cat([s.query.weight, s.key.weight, s.value.weight])
            b = torch.cat([s.query.bias, s.key.bias, s.value.bias])
            self.qkv.append((w, b))
        # the native layer fuses exact GELU; other activations keep the HF modules' path
        self.native = getattr(cfg, "hidden_act", None) == "gelu" and native.shapes_supported(
            self.head_dim, cfg.hidden_size, cfg.intermediate_size
        )

    @torch.inference_mode()
    def embed(self, seqs: list[list[int]], mode: str) -> torch.Tensor:  # (B, D) float32
        lens = [len(s) for s in seqs]
        return pool(self.hidden(seqs), lens, mode)

    def hidden(self, seqs: list[list[int]]) -> torch.Tensor:  # (T, D)
        lens = [len(s) for s in seqs]
        ids = torch.tensor([t for s in seqs for t in s], device=self.device)  # (T,)
        pos = torch.cat([torch.arange(n, device=self.device) for n in lens])  # (T,)
        e = self.hf.embeddings
        h = e.word_embeddings(ids) + e.token_type_embeddings(torch.zeros_like(ids))
        h = e.LayerNorm(h + e.position_embeddings(pos))
        if self.native and native.supported(h):
            offsets = torch.tensor([0, *lens]).cumsum(0)  # (B + 1,)
            work = self._workspace(h.shape[0])
            for layer, (w, b) in zip(self.hf.encoder.layer, self.qkv, strict=True):
                h = self._native_layer(h, layer, w, b, offsets, work)
            return h
        runs = length_runs(lens)
        for layer, (w, b) in zip(self.hf.encoder.layer, self.qkv, strict=True):
            ctx = self._attend(F.linear(h, w, b), runs)  # (T, D)
            out = layer.attention.output
            h = out.LayerNorm(out.dense(ctx) + h)
            inter = layer.intermediate
            out = layer.output
            h = out.LayerNorm(out.dense(inter.intermediate_act_fn(inter.dense(h))) + h)
        return h

    def _workspace(self, num_tokens: int) -> dict[str, torch.Tensor]:
        """The batch's q/k/v, context, GEMM output and intermediate rows, reused by every
        layer: tensors this large are fresh mmaps (page faults) each time malloc hands them out."""
        cfg = self.hf.config
        d = cfg.hidden_size
        return {
            "qkv": torch.empty(num_tokens, 3 * d),
            "ctx": torch.empty(num_tokens, d),
            "dense": torch.empty(num_tokens, d),
            "up": torch.empty(num_tokens, cfg.intermediate_size),
        }

    def _native_layer(self, h, layer, w, b, offsets, work) -> torch.Tensor:  # (T, D)
        """One BertLayer, float32 on CPU, in h's rows: four GEMMs without their biases, each
        bias added by the kernel that reads the GEMM's output (attention, GELU, residual +
        LayerNorm)."""
        qkv = torch.mm(h, w.t(), out=work["qkv"])  # (T, 3D)
        nh, hd = self.num_heads, self.head_dim
        ctx = native.varlen_attention(qkv, b, offsets, nh, hd, out=work["ctx"])
        att = layer.attention.output
        y = torch.mm(ctx, att.dense.weight.t(), out=work["dense"])
        h = self._residual_norm(y, att.dense.bias, h, att.LayerNorm)
        up = torch.mm(h, layer.intermediate.dense.weight.t(), out=work["up"])  # (T, 4D)
        if not native.bias_gelu_(up, layer.intermediate.dense.bias):
            up = F.gelu(up + layer.intermediate.dense.bias)
        out = layer.output
        y = torch.mm(up, out.dense.weight.t(), out=work["dense"])
        return self._residual_norm(y, out.dense.bias, h, out.LayerNorm)

    @staticmethod
    def _residual_norm(y, bias, h, norm) -> torch.Tensor:
        if native.residual_layer_norm_(y, bias, h, norm):
            return h
        return norm(y + bias + h)

    def _attend(self, qkv: torch.Tensor, runs: list[tuple[int, int, int]]) -> torch.Tensor:
        nh, hd = self.num_heads, self.head_dim
        out = torch.empty_like(qkv[:, : nh * hd])  # (T, D)
        for start, b, L in runs:  # b sequences of L tokens: a view of the packed rows
            x = qkv[start : start + b * L].view(b, L, 3, nh, hd)
            q, k, v = x.permute(2, 0, 3, 1, 4).unbind(0)  # each (b, nh, L, hd)
            o = F.scaled_dot_product_attention(q, k, v)  # (b, nh, L, hd)
            out[start : start + b * L].view(b, L, nh, hd).copy_(o.transpose(1, 2))
        return out


def length_runs(lens: list[int]) -> list[tuple[int, int, int]]:
    """(first token row, sequences, length) of each run of equal lengths, in batch order:
    attention over a run needs no padding, no mask and no gather."""
    runs: list[tuple[int, int, int]] = []
    row = 0
    for n in lens:
        if runs and runs[-1][2] == n:
            start, b, _ = runs[-1]
            runs[-1] = (start, b + 1, n)
        else:
            runs.append((row, 1, n))
        row += n
    return runs


class PaddedEncoder:
    """Any HF encoder (AutoModel): a batch padded to its longest sequence (batches are
    length-sorted, so little is padded); padding is dropped before pooling."""

    thread_safe = True

    def __init__(self, hf_model: Any, pad_id: int) -> None:
        self.hf = hf_model
        self.pad_id = pad_id
        self.device = next(hf_model.parameters()).device

    @torch.inference_mode()
    def embed(self, seqs: list[list[int]], mode: str) -> torch.Tensor:
        lens = [len(s) for s in seqs]
        L = max(lens)
        ids = torch.full((len(seqs), L), self.pad_id, device=self.device)
        for i, s in enumerate(seqs):
            ids[i, : len(s)] = torch.tensor(s)
        mask = (
            torch.arange(L, device=self.device)[None]
            < torch.tensor(lens, device=self.device)[:, None]
        )
        h = self.hf(input_ids=ids, attention_mask=mask.long()).last_hidden_state  # (B, L, D)
        return pool(h[mask], lens, mode)
