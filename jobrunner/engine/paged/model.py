"""Our Llama-family forward over the paged KV cache, on the HF model's own modules.

The projections (q/k/v/o, gate/up/down via the HF MLP, lm_head) are the HF `nn.Linear`
modules themselves, so a quantizer that swaps them is picked up here too. Covered: Llama,
Mistral (without an active sliding window), Qwen2 (qkv bias) and Qwen3 (q/k norm).

A bfloat16 model on a CPU with AVX-512 BF16 computes with float32 activations (`act_dtype`):
its linears multiply bfloat16 weights by rows rounded to bfloat16 with float32 accumulation
(csrc/small_gemm_bf16.c), and the residual stream, norms, RoPE and attention queries stay
float32, so every row kernel takes them and nothing is rounded between layers; the KV cache
stays bfloat16. The rows a linear would round are rounded where they are made instead (the
norms before q/k/v and gate/up, the fused gate/up product before down; the kernels read them
in place): the same bits, half the bytes, no rounding pass in the linear; and o_proj and
down add into the residual stream as they make it (SmallRowLinear.add_), the same bits as the
linear and then `h += it`. Elsewhere (another CPU, a GPU, swapped linears) a bfloat16 model computes in
bfloat16 throughout, as HF does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from jobrunner.engine.paged import cpu_kernels
from jobrunner.engine.paged.attention import AttentionMetadata, paged_attention
from jobrunner.engine.paged.layer_parts import (
    RMS_NORMS,
    SILUS,
    Fused,
    apply_fused,
    fuse,
    is_current,
)
from jobrunner.engine.paged.native_layers import NativeLayers
from jobrunner.engine.paged.small_linear import SmallRowLinear

SUPPORTED_TYPES = ("llama", "mistral", "qwen2", "qwen3")
CPU_MLP_TILE = 1024  # token rows per MLP pass on CPU: 4096-row passes run ~25% slower


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


def rms_norm(
    module: nn.Module, x: torch.Tensor, weight: torch.Tensor | None = None, rounded: bool = False
) -> torch.Tensor:
    """HF's Llama/Qwen RMSNorm in one fused op, bit-identical to the module: normalised in
    float32, cast back, then scaled by the weight (`weight`: the module's, converted). Other
    norm modules are called as they are. `rounded`: float32 rows may come back rounded to
    bfloat16 for a bfloat16-weight linear (PagedCausalLM._rounds)."""
    eps = getattr(module, "variance_epsilon", None)
    weight = getattr(module, "weight", None) if weight is None else weight
    if eps is None or weight is None or type(module).__name__ not in RMS_NORMS:
        return module(x)
    if x.dtype == torch.float32 and weight.dtype == torch.float32:
        if weight.dim() == 1 and cpu_kernels.rows_supported(x):
            out = torch.bfloat16 if rounded else torch.float32
            return cpu_kernels.rms_norm(x, weight, eps, out)  # one pass, not six
        return F.rms_norm(x, weight.shape, weight, eps)
    return weight * F.rms_norm(x.float(), weight.shape, None, eps).to(x.dtype)


class StepInterrupted(Exception):
    """A step abandoned between two layers because `PagedCausalLM.stopping()` said so: on a
    slow CPU one prefill step takes minutes, longer than a stop signal may wait. The KV the
    step wrote is garbage; the engine must not run another step."""


def _tiles(h: torch.Tensor, tile: int | None) -> list[torch.Tensor]:
    if tile is None or h.shape[0] <= tile:
        return [h]
    return list(h.split(tile))


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
        # the weights' and KV cache's dtype: the model's first floating-point parameter's
        self.dtype = hf_model.dtype
        self.small_rows = SmallRowLinear() if SmallRowLinear.usable(hf_model) else F.linear
        self.act_dtype = torch.float32 if self._float_rows(hf_model) else self.dtype
        self.norm_weights = self._norm_weights(hf_model)  # module -> weight in act_dtype
        self.rounds_rows = self.act_dtype != self.dtype  # float32 rows of bfloat16 linears
        self.cos, self.sin = self._rope_table(hf_model, max_model_len, self.act_dtype)
        self.rope_kernel = cpu_kernels.rope_supported(self.cos.dtype, self.cos.device)
        self.qkv = [
            fuse([a.q_proj, a.k_proj, a.v_proj]) for a in (x.self_attn for x in self.layers)
        ]
        self.gate_up = [fuse([x.mlp.gate_proj, x.mlp.up_proj]) for x in self.layers]
        on_cpu = next(hf_model.parameters()).device.type == "cpu"
        self.mlp_tile = CPU_MLP_TILE if on_cpu else None
        self.stopping: Callable[[], bool] = _never  # asked between layers (StepInterrupted)
        self.native = NativeLayers(self) if NativeLayers.usable(self) else None  # decode steps

    def _float_rows(self, hf_model: Any) -> bool:
        """Whether a bfloat16 model keeps float32 activations: every linear plain and taken by
        the bfloat16-weight kernel (else it computes in bfloat16, as HF does)."""
        if self.dtype != torch.bfloat16 or not isinstance(self.small_rows, SmallRowLinear):
            return False
        mods = [hf_model.lm_head]
        for x in self.layers:
            a, m = x.self_attn, x.mlp
            mods += [a.q_proj, a.k_proj, a.v_proj, a.o_proj, m.gate_proj, m.up_proj, m.down_proj]
        return all(type(m) is nn.Linear for m in mods)

    def _norm_weights(self, hf_model: Any) -> dict[nn.Module, torch.Tensor]:
        """The RMSNorm weights in act_dtype where it differs from theirs (tiny copies)."""
        if self.act_dtype == self.dtype:
            return {}
        norms = [m for m in hf_model.model.modules() if type(m).__name__ in RMS_NORMS]
        return {m: m.weight.detach().to(self.act_dtype) for m in norms}

    def _norm(self, module: nn.Module, x: torch.Tensor, rounded: bool = False) -> torch.Tensor:
        return rms_norm(module, x, self.norm_weights.get(module), rounded)

    def _rounds(self, fused: Fused | None, mods: list[nn.Module]) -> bool:
        """Whether the norm before these fused linears hands them rows rounded to bfloat16:
        float32 rows of bfloat16 linears (so the bfloat16-weight kernels, which read such rows
        in place, run them) that are still the fused weight. The linear rounds float32 rows
        the same way: the same bits."""
        return self.rounds_rows and is_current(fused, mods)

    def _rows_linear(self, x: torch.Tensor):
        """The small-row linear for x: rows rounded to bfloat16 (_rounds) take its `rounded`."""
        return self.small_rows.rounded if x.dtype != self.act_dtype else self.small_rows

    @staticmethod
    def _rope_table(hf_model: Any, max_len: int, dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """HF's own rotary module (all rope scaling types), evaluated once for every position."""
        param = next(hf_model.parameters())
        positions = torch.arange(max_len, device=param.device)[None]  # (1, max_len)
        cos, sin = hf_model.model.rotary_emb(param.new_zeros(1, dtype=dtype), positions)
        return cos[0].contiguous(), sin[0].contiguous()

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,  # (T,)
        positions: torch.Tensor,  # (T,)
        meta: AttentionMetadata,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        logits_rows: torch.Tensor,  # (R,) token rows whose next-token logits are wanted
    ) -> torch.Tensor:  # (R, vocab) float32
        h = self.hidden_states(input_ids, positions, meta, kv_caches, logits_rows)
        return self._linear(self.hf.lm_head, h).float()

    @torch.inference_mode()
    def hidden_states(
        self,
        input_ids: torch.Tensor,  # (T,)
        positions: torch.Tensor,  # (T,)
        meta: AttentionMetadata,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        out_rows: torch.Tensor | None = None,  # (R,) token rows wanted; None: all
    ) -> torch.Tensor:  # (R, D) after the final norm, in act_dtype
        h = self.hf.model.embed_tokens(input_ids).to(self.act_dtype)  # (T, D), updated in place
        native = self.native is not None and not self.stopping()  # a decode step: one call
        if native and self.native.run(h, positions, meta, kv_caches):
            h = h if out_rows is None else h[out_rows]
        else:
            h = self._layers(h, positions, meta, kv_caches, out_rows)
        return self._norm(self.hf.model.norm, h)  # (R, D)

    def _layers(self, h: torch.Tensor, positions, meta, kv_caches, out_rows=None) -> torch.Tensor:
        """h through every decoder layer, layer by layer, in place; its rows `out_rows` (None:
        all) after the last layer. That layer's attention writes every row's K/V, but only the
        wanted rows go on through o_proj and the MLP, whose outputs nothing else reads (a prompt
        chunk's rows but its last: 1/L of the step's linears saved)."""
        rope = (positions, None, None)  # the C kernel reads the tables by position
        if not self.rope_kernel:
            rope = (positions, self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1))
        last = len(self.layers) - 1
        for i, (layer, (k_cache, v_cache)) in enumerate(zip(self.layers, kv_caches, strict=True)):
            if self.stopping():
                raise StepInterrupted(f"stopped before layer {i} of {len(self.layers)}")
            prune = i == last and out_rows is not None and out_rows.shape[0] < h.shape[0]
            rows = sorted(out_rows.tolist()) if prune else None  # attended for (CPU prefill)
            o = self._attention(i, layer, h, rope, meta, k_cache, v_cache, rows)
            if prune:
                h, o, out_rows = h[out_rows], o[out_rows], None  # (R, D), (R, nh * hd)
                if h.shape[0] == 0:  # a step of prompt chunks that end before their prompts
                    return h
            self._add_linear(h, layer.self_attn.o_proj, o)
            for rows in _tiles(h, self.mlp_tile):  # row tiles keep the MLP's activations cached
                mlp = layer.mlp
                rounded = self._rounds(self.gate_up[i], [mlp.gate_proj, mlp.up_proj])
                self._mlp(i, mlp, self._norm(layer.post_attention_layernorm, rows, rounded), rows)
        return h if out_rows is None else h[out_rows]

    def _linear(self, m: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """A plain nn.Linear through the small-row path; other modules (quantized) as they are,
        on act_dtype rows."""
        if type(m) is nn.Linear:
            return self._rows_linear(x)(x, m.weight, m.bias)
        return m(x.to(self.act_dtype))

    def _add_linear(self, out: torch.Tensor, m: nn.Module, x: torch.Tensor) -> None:
        """out += m(x): a residual stream updated in place, where the small-row linears can
        add as they go (SmallRowLinear.add_) without the linear's output written out first."""
        add = getattr(self.small_rows, "add_", None)
        if add is not None and type(m) is nn.Linear and self.act_dtype == torch.float32:
            return add(out, x, m.weight, m.bias)
        out += self._linear(m, x)  # bfloat16 activations: as HF computes them

    def _mlp(self, i: int, mlp, x: torch.Tensor, out: torch.Tensor) -> None:
        """out += the MLP of x."""
        hidden = self._mlp_hidden(i, mlp, x)
        if hidden is None:
            out += mlp(x.to(self.act_dtype))
        else:
            self._add_linear(out, mlp.down_proj, hidden)

    def _mlp_hidden(self, i: int, mlp, x: torch.Tensor) -> torch.Tensor | None:
        """The down projection's input, act(gate) * up; None where gate/up are no longer the
        fused weight (swapped since), and the MLP module runs as it is."""
        mods, silu = [mlp.gate_proj, mlp.up_proj], type(mlp.act_fn).__name__ in SILUS
        gated = self._silu_gated(self.gate_up[i], mods, mlp.down_proj, x) if silu else None
        if gated is not None:  # gate/up and the product in one kernel
            return gated
        fused = apply_fused(self.gate_up[i], mods, x, self._rows_linear(x))
        if fused is None:
            return None
        gate, up = fused.split(self.gate_up[i][3], dim=-1)
        if silu:
            if gate.shape == up.shape and cpu_kernels.rows_supported(fused):
                return cpu_kernels.silu_mul(fused)  # one pass
            return F.silu(gate, inplace=True).mul_(up)  # in place: no extra (T, n) tensors
        return mlp.act_fn(gate) * up

    def _rotate(self, x: torch.Tensor, rope) -> torch.Tensor:
        positions, cos, sin = rope
        if cos is None:
            return cpu_kernels.rope_(x, self.cos, self.sin, positions)
        return x * cos + rotate_half(x) * sin

    def _silu_gated(self, fused: Fused | None, mods: list[nn.Module], down: nn.Module, x):
        """silu(gate) * up straight from the fused gate/up weight where the small-row linears
        have a kernel for it and this step takes it (SmallRowLinear.silu_gated): bfloat16 rows
        for a plain down projection of a model with float32 activations; else None."""
        if not is_current(fused, mods) or type(down) is not nn.Linear:
            return None
        if self.act_dtype != torch.float32:  # bfloat16 activations: as HF computes them
            return None
        gated = getattr(self.small_rows, "silu_gated", None)
        if gated is None or fused[3][0] != fused[3][1]:
            return None
        return gated(x, fused[1], fused[2])

    def _attention(self, i, layer, h, rope, meta, k_cache, v_cache, rows=None) -> torch.Tensor:
        """The layer's attention output (T, nh * hd), before o_proj: for the token rows `rows`
        only, where given (the others may be left unset; every row's K/V are written)."""
        attn, T = layer.self_attn, h.shape[0]
        mods = [attn.q_proj, attn.k_proj, attn.v_proj]
        x = self._norm(layer.input_layernorm, h, self._rounds(self.qkv[i], mods))
        nh, nkv, hd = self.num_heads, self.num_kv_heads, self.head_dim
        fused = apply_fused(self.qkv[i], mods, x, self._rows_linear(x))  # (T, (nh+2nkv) hd) or None
        written = False
        if fused is not None and not hasattr(attn, "q_norm"):
            qkv = fused.view(T, nh + 2 * nkv, hd)
            written = self._rotate_and_write(qkv, rope, meta, k_cache, v_cache)
            qk = qkv[:, : nh + nkv] if written else self._rotate(qkv[:, : nh + nkv], rope)
            q, k = qk.split((nh, nkv), dim=1)  # q and k rotated in one pass
            v = qkv[:, nh + nkv :]
        else:
            parts = [m(x) for m in mods] if fused is None else fused.split(self.qkv[i][3], -1)
            q = parts[0].view(T, nh, hd)  # (T, nh, hd)
            k = parts[1].view(T, nkv, hd)  # (T, nkv, hd)
            v = parts[2].view(T, nkv, hd)
            if hasattr(attn, "q_norm"):  # Qwen3
                q, k = self._norm(attn.q_norm, q), self._norm(attn.k_norm, k)
            q, k = self._rotate(q.contiguous(), rope), self._rotate(k.contiguous(), rope)
        return paged_attention(q, k, v, k_cache, v_cache, meta, self.scale, written, rows)

    def _rotate_and_write(self, qkv: torch.Tensor, rope, meta, k_cache, v_cache) -> bool:
        """q and k rotated in place and the new K/V written to the cache in one pass, where the
        C kernels rotate and write (cpu_kernels.rope_kv_write_); False where they do not."""
        positions, cos, _ = rope
        if cos is not None or not meta.kernel_writes:
            return False
        nh, slots = self.num_heads, meta.slot_mapping
        return cpu_kernels.rope_kv_write_(
            qkv, nh, self.cos, self.sin, positions, k_cache, v_cache, slots
        )


def _never() -> bool:
    return False
