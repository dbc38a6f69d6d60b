"""Weight quantization (`model.quantization`) and the quantized KV cache (`model.kv_cache_dtype`).

Quantizers are looked up by name in QUANTIZERS (none, int8, int4, fp8); see base.py for the
contract. `apply_quantization` is what the pipeline calls once the model is loaded.
"""

from __future__ import annotations

from typing import Any

from jobrunner.engine.quant import fp8, int4, int8, none  # noqa: F401  (register)
from jobrunner.engine.quant.base import (
    QUANTIZERS,
    Quantizer,
    QuantSummary,
    get_quantizer,
    linear_names,
    quantize_model,
    weight_bytes,
)

__all__ = [
    "QUANTIZERS",
    "QuantSummary",
    "Quantizer",
    "apply_quantization",
    "get_quantizer",
    "linear_names",
    "quantize_model",
    "weight_bytes",
]


def check_quantization(cfg: Any, device: Any, dtype: Any) -> Quantizer:
    """The job's quantizer, after checking the device can run it (ConfigError otherwise)."""
    q = get_quantizer(cfg.quantization)
    q.check(device, dtype)
    return q


def apply_quantization(loaded: Any, cfg: Any) -> QuantSummary:
    """Quantize `loaded.model` in place as `cfg` (a ModelConfig) asks; once per model (the
    quality gate quantizes before the engine is built, the pipeline asks again)."""
    done = getattr(loaded.model, "_jobrunner_quant", None)
    if done is not None:
        if done.quantization != cfg.quantization:
            raise ValueError(f"the model is already quantized as {done.quantization}")
        return done
    q = check_quantization(cfg, loaded.device, loaded.dtype)
    summary = quantize_model(loaded.model, q, list(cfg.keep_in_16bit))
    if q.name != "none":
        loaded.model._jobrunner_quant = summary
    return summary
