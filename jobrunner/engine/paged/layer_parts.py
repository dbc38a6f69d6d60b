"""The parts of an HF decoder layer the paged forward recognises: RMSNorm and SiLU modules by
their type's name, and fused projections (q/k/v, gate/up), one weight standing for several
plain `nn.Linear`s, with the check that it still does (a quantizer may swap the modules)."""

from __future__ import annotations

import torch
from torch import nn

RMS_NORMS = ("LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm")
SILUS = ("SiLU", "SiLUActivation")  # torch's, and what transformers 5 builds for `silu`

# the modules, the fused weight, the fused bias (or None), each module's output size
Fused = tuple[tuple[nn.Module, ...], torch.Tensor, torch.Tensor | None, list[int]]


def fuse(mods: list[nn.Module]) -> Fused | None:
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


def apply_fused(fused: Fused | None, mods: list[nn.Module], x: torch.Tensor, linear):
    """The fused projection (outputs side by side), or None when the modules changed since
    fusing."""
    return linear(x, fused[1], fused[2]) if is_current(fused, mods) else None


def is_current(fused: Fused | None, mods: list[nn.Module]) -> bool:
    """Whether the fused weight still stands for these modules (none swapped since fusing)."""
    return fused is not None and all(a is b for a, b in zip(fused[0], mods, strict=True))
