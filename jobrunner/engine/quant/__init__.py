"""Weight quantization (`model.quantization`) and the quantized KV cache (`model.kv_cache_dtype`).

Quantizers are looked up by name in QUANTIZERS (none, int8, int4, fp8); see base.py for the
contract. `apply_quantization` is what the pipeline calls once the model is loaded.
"""

from __future__ import annotations

from typing import Any

from jobrunner.engine.quant.base import (
    Quantizer,
    QuantSummary,
    linear_names,
    quantize_model,
    weight_bytes,
)
from jobrunner.engine.quant.fp8 import Fp8Quantizer
from jobrunner.engine.quant.int4 import Int4Quantizer
from jobrunner.engine.quant.int8 import Int8Quantizer
from jobrunner.engine.quant.none import NoQuantizer
from jobrunner.registry import Registry

QUANTIZERS: Registry[type[Quantizer]] = Registry(
    "model.quantization",
    {q.name: q for q in (NoQuantizer, Int8Quantizer, Int4Quantizer, Fp8Quantizer)},
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


def get_quantizer(name: str) -> Quantizer:
    return QUANTIZERS.get(name)()


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
