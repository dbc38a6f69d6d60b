"""A model's sentence-transformers files, read without torch (prep and validate use them).

`modules.json` names a Pooling module whose `config.json` sets the mode; without those files
`model.pooling` does (auto: last token for a decoder, mean for an encoder). The modules after
Pooling are the vector's head (`st_head`): Dense layers (a linear map and its activation,
LaBSE's and distiluse's) and Normalize, run in their order; a module of another kind is
refused, since vectors without it would not be the model's. `sentence_bert_config.json`'s
max_seq_length bounds an input's tokens; the last Dense's out_features, else `config.json`'s
hidden_size, is each vector's width (a line's `dimensions` is checked against it in prep).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from jobrunner.errors import ConfigError

ST_MODES = {  # sentence-transformers Pooling config key -> our mode
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
    "pooling_mode_lasttoken": "last",
}
ST_UNSUPPORTED = ("pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens")
# sentence-transformers 5+ saves one `pooling_mode` (a name, or a list of them) instead
ST_MODE_NAMES = {"mean": "mean", "cls": "cls", "lasttoken": "last"}


# sentence-transformers modules jobrunner runs, by class name (the type's last part: its
# module path moved between versions); "Transformer" is the loaded model itself
RUN_MODULES = ("Transformer", "Pooling", "Dense", "Normalize")
# Dense activations (torch.nn classes, as the module's config.json names them): the torch
# function each is, by name; a Dense without the key uses Tanh, as sentence-transformers does
ACTIVATIONS = {
    "torch.nn.modules.activation.Tanh": "tanh",
    "torch.nn.modules.linear.Identity": "identity",
    "torch.nn.modules.activation.ReLU": "relu",
    "torch.nn.modules.activation.GELU": "gelu",
    "torch.nn.modules.activation.Sigmoid": "sigmoid",
    "torch.nn.modules.activation.SiLU": "silu",
}


@dataclass(frozen=True)
class DenseSpec:
    """One Dense module: its folder, shape and activation (a name of ACTIVATIONS' values)."""

    folder: Path
    in_features: int
    out_features: int
    bias: bool
    activation: str


def st_modules(weights_dir: str) -> list[dict]:
    """modules.json's entries in order ([] without the file), each module of a kind jobrunner
    runs (RUN_MODULES); any other kind is a configuration error (78)."""
    root = Path(weights_dir)
    try:
        modules = json.loads((root / "modules.json").read_text())
    except (OSError, ValueError):
        return []
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        return []
    for m in sorted(modules, key=lambda m: m.get("idx", 0)):
        kind = str(m.get("type", "")).rsplit(".", 1)[-1]
        if kind not in RUN_MODULES:
            raise ConfigError(
                f"model.source: {root} has a sentence-transformers module {m.get('type')!r}"
                f" ({m.get('path') or m.get('name')}) that jobrunner does not run (it runs"
                f" {', '.join(RUN_MODULES)}): its vectors would not be the model's"
            )
    return sorted(modules, key=lambda m: m.get("idx", 0))


def _kind(module: dict) -> str:
    return str(module.get("type", "")).rsplit(".", 1)[-1]


def st_head(weights_dir: str) -> list[DenseSpec | str]:
    """The modules after Pooling up to the last Dense, in order: DenseSpec, or "normalize" (a
    Normalize between Dense layers). A Normalize after the last Dense is left to
    `embedding.normalize`, as for models without a head. [] for a model without Dense."""
    modules = st_modules(weights_dir)
    kinds = [_kind(m) for m in modules]
    if "Dense" not in kinds or "Pooling" not in kinds:
        return []
    last = len(kinds) - 1 - kinds[::-1].index("Dense")
    head: list[DenseSpec | str] = []
    for m in modules[kinds.index("Pooling") + 1 : last + 1]:
        head.append(_dense(Path(weights_dir), m) if _kind(m) == "Dense" else "normalize")
    return head


def _dense(root: Path, module: dict) -> DenseSpec:
    folder = root / str(module.get("path", ""))
    try:
        conf = json.loads((folder / "config.json").read_text())
        shape = int(conf["in_features"]), int(conf["out_features"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"model.source: {folder}/config.json is not a Dense module's: {e}") from e
    name = conf.get("activation_function", "torch.nn.modules.activation.Tanh")
    if name not in ACTIVATIONS:
        raise ConfigError(
            f"model.source: {folder} applies {name!r}, which jobrunner does not run (it runs"
            f" {', '.join(k.rsplit('.', 1)[-1] for k in ACTIVATIONS)})"
        )
    return DenseSpec(folder, *shape, bool(conf.get("bias", True)), ACTIVATIONS[name])


def st_pooling(weights_dir: str) -> str | None:
    """The pooling mode of a sentence-transformers model directory, or None without the files."""
    root = Path(weights_dir)
    pooling = [m for m in st_modules(weights_dir) if _kind(m) == "Pooling"]
    if not pooling:
        return None
    try:
        conf = json.loads((root / pooling[0].get("path", "") / "config.json").read_text())
    except (OSError, ValueError):
        return None
    modes, odd = _modes(conf)
    if odd or len(modes) != 1:
        raise ConfigError(
            f"model.source: {root} pools with {', '.join(odd + modes) or 'no mode'}; only one"
            " of mean, cls and last token is supported (set model.pooling to override)"
        )
    return modes[0]


def _modes(conf: dict) -> tuple[list[str], list[str]]:
    """(our modes, the modes we do not run) a Pooling config.json names, in either format."""
    if "pooling_mode" not in conf:
        modes = [mode for key, mode in ST_MODES.items() if conf.get(key)]
        return modes, [key for key in ST_UNSUPPORTED if conf.get(key)]
    named = conf["pooling_mode"]
    named = [named] if isinstance(named, str) else named if isinstance(named, list) else []
    return [ST_MODE_NAMES[n] for n in named if n in ST_MODE_NAMES], [
        str(n) for n in named if n not in ST_MODE_NAMES
    ]


def st_max_seq_length(weights_dir: str) -> int | None:
    """sentence_bert_config.json's max_seq_length: the length the model was trained to embed."""
    try:
        conf = json.loads((Path(weights_dir) / "sentence_bert_config.json").read_text())
    except (OSError, ValueError):
        return None
    n = conf.get("max_seq_length")
    return int(n) if isinstance(n, int) and n > 0 else None


def vector_width(weights_dir: str) -> int | None:
    """The values of each vector (the engine's width): the head's last Dense's out_features,
    else config.json's hidden_size; None when the directory does not say."""
    dense = [d for d in st_head(weights_dir) if isinstance(d, DenseSpec)]
    if dense:
        return dense[-1].out_features
    try:
        conf = json.loads((Path(weights_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    n = conf.get("hidden_size") if isinstance(conf, dict) else None
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None


def pooling_mode(configured: str, weights_dir: str, decoder: bool) -> str:
    """`model.pooling` when set, else the model's files, else last (decoder) or mean."""
    if configured != "auto":
        return configured
    return st_pooling(weights_dir) or ("last" if decoder else "mean")
