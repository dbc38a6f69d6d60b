"""A model's sentence-transformers files, read without torch (prep and validate use them).

`modules.json` names a Pooling module whose `config.json` sets the mode; without those files
`model.pooling` does (auto: last token for a decoder, mean for an encoder).
`sentence_bert_config.json`'s max_seq_length bounds an input's tokens; `config.json`'s
hidden_size is each vector's width (a line's `dimensions` is checked against it in prep).
"""

from __future__ import annotations

import json
from pathlib import Path

from jobrunner.errors import ConfigError

ST_MODES = {  # sentence-transformers Pooling config key -> our mode
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
    "pooling_mode_lasttoken": "last",
}
ST_UNSUPPORTED = ("pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens")


def st_pooling(weights_dir: str) -> str | None:
    """The pooling mode of a sentence-transformers model directory, or None without the files."""
    root = Path(weights_dir)
    try:
        modules = json.loads((root / "modules.json").read_text())
    except (OSError, ValueError):
        return None
    pooling = [m for m in modules if str(m.get("type", "")).endswith("Pooling")]
    if not pooling:
        return None
    try:
        conf = json.loads((root / pooling[0].get("path", "") / "config.json").read_text())
    except (OSError, ValueError):
        return None
    modes = [mode for key, mode in ST_MODES.items() if conf.get(key)]
    odd = [key for key in ST_UNSUPPORTED if conf.get(key)]
    if odd or len(modes) != 1:
        raise ConfigError(
            f"model.source: {root} pools with {', '.join(odd + modes) or 'no mode'}; only one"
            " of mean, cls and last token is supported (set model.pooling to override)"
        )
    return modes[0]


def st_max_seq_length(weights_dir: str) -> int | None:
    """sentence_bert_config.json's max_seq_length: the length the model was trained to embed."""
    try:
        conf = json.loads((Path(weights_dir) / "sentence_bert_config.json").read_text())
    except (OSError, ValueError):
        return None
    n = conf.get("max_seq_length")
    return int(n) if isinstance(n, int) and n > 0 else None


def vector_width(weights_dir: str) -> int | None:
    """config.json's hidden_size: the values of each pooled vector (the engine's width), or
    None when the directory does not say."""
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
