"""The quantizer contract and the model walk that applies one.

A quantizer is two verbs and a module with a one-line forward:
  `quantize_weight(w)`        float weight (N, K) -> a state dict of quantized tensors;
  `linear(state, bias)`       that state -> a module that computes x @ w.T (+ bias);
  `embedding(w, state)`       optional: the input embedding from the same format (a tied
                              lm_head's state is passed so both share one copy).
`quantize_model` swaps the HF model's `nn.Linear` (and embedding) modules in place, so the
static engine (HF generate) and the paged engine (which calls the same modules) both use them.
"""

from __future__ import annotations

import fnmatch
import logging
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from jobrunner.errors import ConfigError

log = logging.getLogger(__name__)


class Quantizer:
    name = "none"
    bits = 16

    def check(self, device: torch.device, dtype: torch.dtype) -> None:
        """Raise ConfigError when this device cannot run the format."""

    def supports(self, weight: torch.Tensor) -> str | None:
        """None when this weight can be quantized, else why not (the layer stays 16-bit)."""
        return None

    def quantize_weight(self, weight: torch.Tensor) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def linear(self, state: dict[str, torch.Tensor], bias: torch.Tensor | None) -> nn.Module:
        raise NotImplementedError

    def embedding(
        self, weight: torch.Tensor, state: dict[str, torch.Tensor] | None
    ) -> nn.Module | None:
        return None


@dataclass
class QuantSummary:
    """What `quantize_model` did; goes into the manifest's run record."""

    quantization: str
    quantized: list[str] = field(default_factory=list)
    kept_16bit: list[str] = field(default_factory=list)
    weight_bytes: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "quantization": self.quantization,
            "weight_bytes": self.weight_bytes,
            "num_quantized_layers": len(self.quantized),
            "keep_in_16bit": self.kept_16bit,
        }


def linear_names(model: nn.Module) -> list[str]:
    """Every `nn.Linear` of the model, by module name (`model.layers.0.mlp.up_proj`, `lm_head`)."""
    return [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]


def check_patterns(model: nn.Module, patterns: list[str]) -> None:
    names = [n for n, _ in model.named_modules() if n]
    for p in patterns:
        if not any(fnmatch.fnmatchcase(n, p) for n in names):
            raise ConfigError(
                f"model.keep_in_16bit: {p!r} matches no layer of the model (names look like"
                f" {names[-1]!r} or 'model.layers.*.mlp.down_proj'; `jobrunner quantize-check`"
                " lists them)"
            )


def is_kept(name: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def quantize_model(model: nn.Module, q: Quantizer, keep: list[str]) -> QuantSummary:
    """Swap each quantizable Linear (and the input embedding) for its quantized module, in place."""
    summary = QuantSummary(q.name)
    if q.name == "none":
        summary.weight_bytes = weight_bytes(model)
        return summary
    check_patterns(model, keep)
    emb = model.get_input_embeddings()
    head = getattr(model, "lm_head", None)
    tied = isinstance(head, nn.Linear) and emb is not None and head.weight is emb.weight
    head_state = None
    for name in linear_names(model):
        module = model.get_submodule(name)
        why = "keep_in_16bit" if is_kept(name, keep) else q.supports(module.weight)
        if why:
            summary.kept_16bit.append(name)
            log.info("%s stays 16-bit (%s)", name, why)
            continue
        state = q.quantize_weight(module.weight.detach())
        _set_module(model, name, q.linear(state, module.bias))
        summary.quantized.append(name)
        if module is head:
            head_state = state
    _quantize_embedding(model, q, keep, emb, head_state if tied else None, tied, summary)
    summary.weight_bytes = weight_bytes(model)
    return summary


def _quantize_embedding(model, q, keep, emb, head_state, tied, summary) -> None:
    name = next((n for n, m in model.named_modules() if m is emb), None)
    if emb is None or name is None:
        return
    if is_kept(name, keep) or (tied and head_state is None):  # a 16-bit tied head needs the weight
        summary.kept_16bit.append(name)
        return
    module = q.embedding(emb.weight.detach(), head_state)
    if module is None:
        summary.kept_16bit.append(name)
        return
    _set_module(model, name, module)
    summary.quantized.append(name)


def _set_module(model: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, module)


def weight_bytes(model: nn.Module) -> int:
    """Bytes of every distinct tensor storage the model holds (tied weights count once)."""
    seen: dict[int, int] = {}
    for t in [*model.parameters(), *model.buffers()]:
        if t.device.type == "meta":
            continue
        s = t.untyped_storage()
        seen[s.data_ptr()] = max(seen.get(s.data_ptr(), 0), s.nbytes())
    return sum(seen.values())


def flat(x: torch.Tensor) -> torch.Tensor:
    """(..., K) -> (M, K): the quantized matmuls take 2-D inputs."""
    return x.reshape(-1, x.shape[-1])
