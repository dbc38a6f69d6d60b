"""`start_engine(cfg)`: the one way an executor gets a running engine.

Load the model, run the quality gate and quantize (engine/quant/apply.py), build the engine the
job asks for (engine/engines.py) and check the KV-cache format can follow it. The local pipeline
and every Ray worker call it, so both run the same checks in the same order.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from jobrunner.config import JobConfig
from jobrunner.engine import loader
from jobrunner.engine.base import Engine
from jobrunner.engine.engines import make_engine
from jobrunner.engine.loader import LoadedModel
from jobrunner.engine.quant.apply import check_engine, prepare_weights


@dataclass
class StartedEngine:
    loaded: LoadedModel
    engine: Engine
    weights: dict[str, Any]  # the run record's quantization and quality figures
    load_seconds: float  # from `since` to a ready engine


def start_engine(
    cfg: JobConfig, since: float | None = None, cpu_threads: int | None = None
) -> StartedEngine:
    """Raises ConfigError (78) for a model or format this device cannot run and
    QualityBelowThreshold (65) when the quantized model falls below the bar. `cpu_threads`:
    torch's threads on a CPU device, unless engine.num_threads sets them."""
    t0 = time.monotonic() if since is None else since
    loaded = loader.load_model(cfg.model)  # looked up here: tests stand in for it
    if cpu_threads and loaded.device.type == "cpu" and not cfg.engine.num_threads:
        import torch

        torch.set_num_threads(max(1, cpu_threads))
    weights = prepare_weights(loaded, cfg)
    engine = make_engine(loaded, cfg)
    check_engine(engine, cfg)
    engine.warm_up()
    return StartedEngine(loaded, engine, weights, time.monotonic() - t0)
