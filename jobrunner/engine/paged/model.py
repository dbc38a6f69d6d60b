"""Our Llama-family forward over the paged KV cache, on the HF model's own modules.

The projections (q/k/v/o, gate/up/down via the HF MLP, lm_head) are the HF `nn.Linear`
modules themselves, so a quantizer that swaps them is picked up here too. Covered: Llama,
Mistral (without an active sliding window), Qwen2 (qkv bias) and Qwen3 (q/k norm).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from jobrunner.engine.paged.attention import AttentionMetadata, paged_attention

SUPPORTED_TYPES = ("llama", "mistral", "qwen2", "qwen3")


def unsupported_reason(hf_model: Any, max_model_len: int) -> str | None:
    cfg = hf_model.config
    if cfg.model_type not in SUPPORTED_TYPES:
        return f"model type {cfg.model_type!r} is not one of {', '.join(SUPPORTED_TYPES)}"
    window = getattr(cfg, "sliding_window", None)
    if window and getattr(cfg, "use_sliding_window", True) and window < max_model_len:
        return f"sliding-window attention ({window} < max_model_len {max_model_len})"
    inner = getattr(hf_model, "model", None)
    if inner is None or not hasattr(inner, "rotary_emb") or not hasattr(inner, "layers"):
        return "unexpected module layout (no model.layers / model.rotary_emb)"
    return None


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class PagedCausalLM:
    def __init__(self, hf_model: Any, max_model_len: int):
        cfg = hf_model.config
        self.hf = hf_model
        self.layers = list(hf_model.model.layers)
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = getattr(cfg, "num_key_value_heads", None) or self.num_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.num_heads
        self.scale = self.head_dim**-0.5
        self.cos, self.sin = self._rope_table(hf_model, max_model_len)  # (max_len, hd)
        self.qkv = [_fuse([a.q_proj, a.k_proj, a.v_proj]) for a in (x.self_attn for x in self.layers)]
        self.gate_up = [_fuse([x.mlp.gate_proj, x.mlp.up_proj]) for x in self.layers]

    @staticmethod
    def _rope_table(hf_model: Any, max_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """HF's own rotary module (all rope scaling types), evaluated once for every position."""
        param = next(hf_model.parameters())
        positions = torch.arange(max_len, device=param.device)[None]  # (1, max_len)
        cos, sin = hf_model.model.rotary_emb(param.new_zeros(1), positions)
        return cos[0], sin[0]

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,  # (T,)
        positions: torch.Tensor,  # (T,)
        meta: AttentionMetadata,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        logits_rows: torch.Tensor,  # (R,) token rows whose next-token logits are wanted
    ) -> torch.Tensor:  # (R, vocab) float32
        cos = self.cos[positions].unsqueeze(1)  # (T, 1, hd)
        sin = self.sin[positions].unsqueeze(1)
        h = self.hf.model.embed_tokens(input_ids)  # (T, D)
        for i, (layer, (k_cache, v_cache)) in enumerate(zip(self.layers, kv_caches, strict=True)):
            h = h + self._attention(i, layer, h, cos, sin, meta, k_cache, v_cache)
            h = h + self._mlp(i, layer.mlp, layer.post_attention_layernorm(h))
        h = self.hf.model.norm(h[logits_rows])  # (R, D)
        return self.hf.lm_head(h).float()

    def _mlp(self, i: int, mlp, x: torch.Tensor) -> torch.Tensor:
        fused = _apply(self.gate_up[i], [mlp.gate_proj, mlp.up_proj], x)
        if fused is None:
            return mlp(x)
        parts = fused.split(self.gate_up[i][3], dim=-1)
        return mlp.down_proj(mlp.act_fn(parts[0]) * parts[1])

    def _attention(self, i, layer, h, cos, sin, meta, k_cache, v_cache) -> torch.Tensor:
        attn, T = layer.self_attn, h.shape[0]
        x = layer.input_layernorm(h)
        mods = [attn.q_proj, attn.k_proj, attn.v_proj]
        nh, nkv, hd = self.num_heads, self.num_kv_heads, self.head_dim
        fused = _apply(self.qkv[i], mods, x)  # (T, (nh + 2 nkv) hd) or None
        if fused is not None and not hasattr(attn, "q_norm"):
            qkv = fused.view(T, nh + 2 * nkv, hd)
            qk = qkv[:, : nh + nkv]  # q and k rotated in one pass
            qk = qk * cos + rotate_half(qk) * sin
            q, k = qk.split((nh, nkv), dim=1)
            v = qkv[:, nh + nkv :]
        else:
            parts = [m(x) for m in mods] if fused is None else fused.split(self.qkv[i][3], -1)
            q = parts[0].view(T, nh, hd)  # (T, nh, hd)
            k = parts[1].view(T, nkv, hd)  # (T, nkv, hd)
            v = parts[2].view(T, nkv, hd)
            if hasattr(attn, "q_norm"):  # Qwen3
                q, k = attn.q_norm(q), attn.k_norm(k)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
        o = paged_attention(q, k, v, k_cache, v_cache, meta, self.scale)  # (T, nh * hd)
        return attn.o_proj(o)


Fused = tuple[tuple[nn.Module, ...], torch.Tensor, torch.Tensor | None, list[int]]


def _fuse(mods: list[nn.Module]) -> Fused | None:
    """One weight for several plain `nn.Linear`s reading the same input (q/k/v, gate/up): the
    modules' weights become views into it, so no memory is added. None when any module is not
    a plain Linear (e.g. swapped by a quantizer) or only some have a bias."""
    if not all(type(m) is nn.Linear for m in mods):
        return None
    biases = [m.bias for m in mods]
    if any(b is None for b in biases) and any(b is not None for b in biases):
        return None
    sizes = [m.out_features for m in mods]
    with torch.no_grad():
        weight = torch.cat([m.weight for m in mods])
        bias = None if biases[0] is None else torch.cat(biases)
        for m, w in zip(mods, weight.split(sizes), strict=True):
            m.weight = nn.Parameter(w, requires_grad=False)
        if bias is not None:
            for m, b in zip(mods, bias.split(sizes), strict=True):
                m.bias = nn.Parameter(b, requires_grad=False)
    return tuple(mods), weight, bias, sizes


def _apply(fused: Fused | None, mods: list[nn.Module], x: torch.Tensor):
    """The fused projection (outputs side by side), or None when the modules changed since
    fusing."""
    if fused is None or any(a is not b for a, b in zip(fused[0], mods, strict=True)):
        return None
    return F.linear(x, fused[1], fused[2])
