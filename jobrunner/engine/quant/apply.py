"""What the pipeline calls between loading the model and building the engine."""

from __future__ import annotations

from typing import Any

from jobrunner.engine.quant import apply_quantization, check_quantization
from jobrunner.engine.quant.quality import enforce, run_quality_check
from jobrunner.errors import ConfigError


def prepare_weights(loaded: Any, cfg: Any) -> dict[str, Any]:
    """Quality gate (when asked), then quantization; returns the run record's figures.

    Raises ConfigError for a format this device cannot run, QualityBelowThreshold (exit 65)
    when the quantized model falls below model.quality_min_agreement."""

    m = cfg.model
    check_quantization(m, loaded.device, loaded.dtype)
    if m.kv_cache_dtype != "auto" and cfg.engine.kind == "static":
        raise ConfigError(
            f"model.kv_cache_dtype: a {m.kv_cache_dtype} KV cache needs the paged"
            " engine (engine.kind: paged); the static engine keeps HF's cache"
        )
    record: dict[str, Any] = {
        "dtype": str(loaded.dtype).removeprefix("torch."),
        "dtype_reason": getattr(loaded, "dtype_reason", ""),
        "kv_cache_dtype": m.kv_cache_dtype,
    }
    if (m.quantization != "none" or m.kv_cache_dtype != "auto") and m.quality_check:
        quality = run_quality_check(loaded, cfg, lambda: apply_quantization(loaded, m))
        record["quality"] = quality.to_json()
        enforce(quality, cfg)
    record.update(apply_quantization(loaded, m).to_json())
    return record


def check_engine(engine: Any, cfg: Any) -> None:
    """The paged engine may fall back to static; a KV cache in another format cannot follow it."""
    if cfg.model.kv_cache_dtype != "auto" and engine.kind != "paged":
        raise ConfigError(
            f"model.kv_cache_dtype: {cfg.model.kv_cache_dtype} needs the paged"
            f" engine, which cannot run this model ({'; '.join(engine.stats.notes)})"
        )
