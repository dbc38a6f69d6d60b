"""A decode step's decoder layers in one native call (csrc/decode_layers.c).

From Python a decoder layer of a decode step is eight kernel calls or more
(model.PagedCausalLM), each converting its arguments and allocating its output while the other
threads wait: at 64 rows on Zen 4 about a tenth of the step. Where the model and the step are
what those kernels take, `NativeLayers` runs every layer in one call: the same kernels in the
same order on the same rows, so the same bits. The model: a bfloat16 one with float32
activations on AVX-512 BF16 (the mixed mode), or a float32 one on our float32 linears
(AVX-512, AVX2 or NEON: csrc/small_gemm.c); either way every projection a plain, still-fused
Linear of the model's dtype, RMSNorms, a SiLU-gated MLP (in the mixed mode its intermediate
size a multiple of 32), no q/k norm. The step: decode rows only, in the kernel's one group,
over a float32 or bfloat16 cache. Anything else takes the Python loop.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch import nn

from jobrunner.engine.paged import cpu_kernels
from jobrunner.engine.paged.attention import AttentionMetadata, DecodeGroup
from jobrunner.engine.paged.layer_parts import RMS_NORMS, SILUS, is_current
from jobrunner.engine.paged.small_linear import SmallRowLinear

CACHE_DTYPES = (torch.float32, torch.bfloat16)  # what rope.c's K/V write stores


class NativeLayers:
    """Decode steps of one PagedCausalLM through csrc/decode_layers.c. The table of each layer's
    addresses is built at the first step and again whenever a module, a weight or a cache it
    came from is no longer the same object."""

    def __init__(self, model: Any) -> None:
        self.model = model  # the PagedCausalLM
        self.float_weights = not model.rounds_rows  # float32 linears (else the mixed mode)
        self.key: list[object] | None = None  # what the table was built from
        self.table: tuple[torch.Tensor, torch.Tensor, int] | None = None  # addresses, eps, n
        self.tensors: list[torch.Tensor | None] = []  # what the addresses point into
        self.in_place: list[tuple[torch.Tensor, int]] = []  # parameters read where they are

    @staticmethod
    def usable(model: Any) -> bool:
        """Whether the model runs in a mode the kernels take at all: the mixed mode, or float32
        weights and rows on our float32 linears."""
        if not model.rope_kernel:
            return False
        if model.rounds_rows:
            return cpu_kernels.gemm_bf16_supported()
        rows = model.small_rows
        return (
            model.dtype == torch.float32
            and model.act_dtype == torch.float32
            and isinstance(rows, SmallRowLinear)
            and rows.native
        )

    def run(self, h: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata, kv_caches):
        """h (T, H) float32 through every decoder layer, in place, the new K/V in the caches;
        False, and nothing done, where the step or the model is not one the kernels take."""
        group = _decode_group(meta, h.shape[0], self.model.mlp_tile)
        if group is None or self.model.rounds_rows == self.float_weights:  # not the mode built
            return False
        table = self._table(kv_caches)
        if table is None:
            return False
        m, (addresses, eps, n) = self.model, table
        cpu_kernels.decode_layers(
            addresses, eps, h, (m.num_heads, m.num_kv_heads, m.head_dim, n),
            (m.cos, m.sin, positions), meta.slot_mapping, kv_caches[0][0], group.block_tables,
            group.context_lens, m.scale, self.float_weights,
        )  # fmt: skip
        return True

    def _table(self, kv_caches) -> tuple[torch.Tensor, torch.Tensor, int] | None:
        key = self._key(kv_caches)
        same = self.key is not None and len(key) == len(self.key)
        same = same and all(map(operator.is_, key, self.key))
        # a parameter whose storage was replaced (`p.data = t`) is the same object elsewhere
        if not (same and all(t.data_ptr() == at for t, at in self.in_place)):
            self.key, self.table = key, self._build(kv_caches)
        return self.table

    def _key(self, kv_caches) -> list[object]:
        """Every object the table's addresses come from, or that decides whether it is taken:
        each layer's submodules (norms, attention, MLP), theirs (projections, q/k norms, the
        activation), o_proj's, down's and the norms' parameters, and the caches. Read from the
        modules' registries (`_modules`, `_parameters`, where nn.Module keeps what is assigned
        to it) rather than attribute by attribute: this runs every decode step (SmolLM2: 412 ->
        35 us). The parameters the kernels read in place (a float32 model's norm weights and
        biases) are checked by address as well (`in_place`): new storage under the same one."""
        key: list[object] = []
        for layer, (k, v) in zip(self.model.layers, kv_caches, strict=True):
            a, m = layer._modules["self_attn"], layer._modules["mlp"]
            key += layer._modules.values()
            key += a._modules.values()
            key += m._modules.values()
            key += a._modules["o_proj"]._parameters.values()
            key += m._modules["down_proj"]._parameters.values()
            key += layer._modules["input_layernorm"]._parameters.values()  # float32: read in
            key += layer._modules["post_attention_layernorm"]._parameters.values()  # place
            key += (k, v)
        return key

    def _build(self, kv_caches) -> tuple[torch.Tensor, torch.Tensor, int] | None:
        rows, eps, sizes, self.tensors, self.in_place = [], [], set(), [], []
        for i, (layer, (k, v)) in enumerate(zip(self.model.layers, kv_caches, strict=True)):
            got = self._layer(i, layer, k, v, kv_caches[0][0])
            if got is None:
                return None
            tensors, norm_eps, n = got
            self.tensors += tensors
            self.in_place += [(t, t.data_ptr()) for t in tensors if isinstance(t, nn.Parameter)]
            rows.append([0 if t is None else t.data_ptr() for t in tensors])
            eps.append(norm_eps)
            sizes.add(n)
        if len(sizes) != 1:
            return None
        return torch.tensor(rows), torch.tensor(eps, dtype=torch.float32), sizes.pop()

    def _layer(self, i: int, layer, k, v, first) -> tuple[list, tuple[float, float], int] | None:
        """The layer's row of addresses (csrc/decode_layers.c's LAYER_PTRS order), its norms'
        epsilons and its intermediate size; None where the kernels do not take it."""
        m, a, mlp = self.model, layer.self_attn, layer.mlp
        qkv, gate_up = m.qkv[i], m.gate_up[i]
        o, down = a.o_proj, mlp.down_proj
        taken = (
            not hasattr(a, "q_norm")
            and type(mlp.act_fn).__name__ in SILUS
            and is_current(qkv, [a.q_proj, a.k_proj, a.v_proj])
            and is_current(gate_up, [mlp.gate_proj, mlp.up_proj])
            and all(type(x) is nn.Linear for x in (o, down))
            and gate_up[3][0] == gate_up[3][1]
            and self._shapes_fit(qkv[1], o.weight, gate_up[1], down.weight)
            and _same_cache(k, first, m)
            and _same_cache(v, first, m)
        )
        norms = [self._norm(x) for x in (layer.input_layernorm, layer.post_attention_layernorm)]
        if not taken or None in norms:
            return None
        rows = m.small_rows
        tensors = [
            norms[0][0], rows.packed_weight(qkv[1]), rows.float_bias(qkv[2]),
            rows.packed_weight(o.weight), rows.float_bias(o.bias), norms[1][0],
            rows.packed_weight(gate_up[1]), rows.float_bias(gate_up[2]),
            rows.packed_weight(down.weight), rows.float_bias(down.bias), k, v,
        ]  # fmt: skip
        return tensors, (norms[0][1], norms[1][1]), gate_up[3][0]

    def _shapes_fit(self, qkv, o, gate_up, down) -> bool:
        """Weights of the mode's dtype and of the shapes the kernels assume: q/k/v from the
        hidden size to the heads, o back, gate/up to twice an intermediate size (in the mixed
        mode a multiple of 32: small_gemm_bf16_silu's panels), down back."""
        m = self.model
        hidden, heads = m.hf.config.hidden_size, m.num_heads * m.head_dim
        n = gate_up.shape[0] // 2
        shapes = [(heads + 2 * m.num_kv_heads * m.head_dim, hidden), (hidden, heads)]
        shapes += [(2 * n, hidden), (hidden, n)]
        weights = (qkv, o, gate_up, down)
        dtype = torch.float32 if self.float_weights else torch.bfloat16
        if any(w.dtype != dtype for w in weights) or (n % 32 and not self.float_weights):
            return False
        return all(tuple(w.shape) == shape for w, shape in zip(weights, shapes, strict=True))

    def _norm(self, module: nn.Module) -> tuple[torch.Tensor, float] | None:
        """An RMSNorm's float32 weight and epsilon, as model.rms_norm runs it in one pass."""
        eps = getattr(module, "variance_epsilon", None)
        weight = self.model.norm_weights.get(module, getattr(module, "weight", None))
        if eps is None or weight is None or type(module).__name__ not in RMS_NORMS:
            return None
        hidden = self.model.hf.config.hidden_size
        if weight.dtype != torch.float32 or weight.shape != (hidden,) or weight.stride() != (1,):
            return None
        return weight, eps


def _decode_group(meta: AttentionMetadata, rows: int, max_rows: int | None) -> DecodeGroup | None:
    """The step's one group of decode rows, where the step is nothing else and the decode
    kernel attends it (no mask), in one MLP tile."""
    if (
        meta.triton is not None
        or meta.prefills
        or len(meta.decode_groups) != 1
        or not meta.kernel_writes
    ):
        return None
    group = meta.decode_groups[0]
    if group.mask is not None or (group.start, group.end) != (0, rows):
        return None
    return None if max_rows is not None and rows > max_rows else group


def _same_cache(cache, first, model) -> bool:
    """A plain, contiguous float32 or bfloat16 layer cache (nkv, num_blocks, bs, hd) laid out as
    the first layer's."""
    return (
        isinstance(cache, torch.Tensor)
        and cache.dtype in CACHE_DTYPES
        and cache.is_contiguous()
        and cache.dtype == first.dtype
        and cache.shape == first.shape
        and (cache.shape[0], cache.shape[3]) == (model.num_kv_heads, model.head_dim)
    )
