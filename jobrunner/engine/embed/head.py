"""A sentence-transformers model's head: the Dense layers (and any Normalize between them) that
turn a pooled vector into the model's embedding (st_files.st_head), run in float32."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from jobrunner.engine.embed.st_files import DenseSpec, st_head
from jobrunner.errors import ConfigError

ACT = {
    "tanh": torch.tanh,
    "identity": lambda x: x,
    "relu": F.relu,
    "gelu": F.gelu,
    "sigmoid": torch.sigmoid,
    "silu": F.silu,
}
WEIGHTS = "model.safetensors"


class Head:
    """`head(vectors)`: the pooled vectors [rows, hidden] through the model's head; the vectors
    unchanged (float32) for a model without one."""

    def __init__(self, weights_dir: str, hidden: int, allow_pickle: bool = False) -> None:
        self.steps: list[tuple[torch.Tensor, torch.Tensor | None, str] | str] = []
        width = hidden
        for spec in st_head(weights_dir):
            if isinstance(spec, DenseSpec):
                if spec.in_features != width:
                    raise ConfigError(
                        f"model.source: {spec.folder} takes {spec.in_features} values, but the"
                        f" vectors before it have {width}"
                    )
                self.steps.append(_dense(spec, allow_pickle))
                width = spec.out_features
            else:
                self.steps.append(spec)
        self.width = width

    def __call__(self, vectors: torch.Tensor) -> torch.Tensor:
        v = vectors.float()
        for step in self.steps:
            if step == "normalize":
                v = F.normalize(v, dim=-1)
            else:
                weight, bias, act = step
                v = ACT[act](F.linear(v, weight, bias))
        return v


def _dense(spec: DenseSpec, allow_pickle: bool) -> tuple[torch.Tensor, torch.Tensor | None, str]:
    state = _state(spec, allow_pickle)
    weight, bias = state.get("linear.weight"), state.get("linear.bias")
    if weight is None or tuple(weight.shape) != (spec.out_features, spec.in_features):
        raise ConfigError(
            f"model.source: {spec.folder}'s weights hold no linear.weight of"
            f" {spec.out_features} x {spec.in_features}"
        )
    if spec.bias and bias is None:
        raise ConfigError(f"model.source: {spec.folder}'s weights hold no linear.bias")
    return weight.float(), (bias.float() if spec.bias else None), spec.activation


def _state(spec: DenseSpec, allow_pickle: bool) -> dict[str, torch.Tensor]:
    if (spec.folder / WEIGHTS).is_file():
        from safetensors.torch import load_file

        return load_file(str(spec.folder / WEIGHTS))
    pickled = spec.folder / "pytorch_model.bin"
    if pickled.is_file() and allow_pickle:
        return torch.load(str(pickled), map_location="cpu", weights_only=True)
    if pickled.is_file():
        raise ConfigError(
            f"model.source: {spec.folder} holds its weights as pytorch_model.bin (set"
            " model.allow_pickle: true to load .bin weights)"
        )
    raise ConfigError(f"model.source: {spec.folder} holds no {WEIGHTS}")
