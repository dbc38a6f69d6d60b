"""Our Llama-family forward over the paged KV cache, on the HF model's own modules.

The projections (q/k/v/o, gate/up/down via the HF MLP, lm_head) are the HF `nn.Linear`
modules themselves, so a quantizer that swaps them is picked up here too. Covered: Llama,
Mistral (without an active sliding window), Qwen2 (qkv bias) and Qwen3 (q/k norm).
"""

from __future__ import annotations

from typing import Any

import torch

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
        for layer, (k_cache, v_cache) in zip(self.layers, kv_caches, strict=True):
            h = h + self._attention(layer, h, cos, sin, meta, k_cache, v_cache)
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        h = self.hf.model.norm(h[logits_rows])  # (R, D)
        return self.hf.lm_head(h).float()

    def _attention(self, layer, h, cos, sin, meta, k_cache, v_cache) -> torch.Tensor:
        attn, T = layer.self_attn, h.shape[0]
        x = layer.input_layernorm(h)
        q = attn.q_proj(x).view(T, self.num_heads, self.head_dim)  # (T, nh, hd)
        k = attn.k_proj(x).view(T, self.num_kv_heads, self.head_dim)  # (T, nkv, hd)
        v = attn.v_proj(x).view(T, self.num_kv_heads, self.head_dim)
        if hasattr(attn, "q_norm"):  # Qwen3
            q, k = attn.q_norm(q), attn.k_norm(k)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        o = paged_attention(q, k, v, k_cache, v_cache, meta, self.scale)  # (T, nh * hd)
        return attn.o_proj(o)
