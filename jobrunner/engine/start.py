"""`start_engine(cfg)`: the one way an executor gets a running engine.

Load the model, run the quality gate and quantize (engine/quant/apply.py), build the engine the
job asks for (engine/engines.py) and check the KV-cache format can follow it. The local pipeline
and every Ray worker call it, so both run the same checks in the same order.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobrunner import collector
from jobrunner.config import JobConfig
from jobrunner.engine import loader
from jobrunner.engine.base import Engine
from jobrunner.engine.engines import make_engine
from jobrunner.engine.loader import LoadedModel
from jobrunner.engine.quant.apply import check_engine, prepare_weights

log = logging.getLogger(__name__)

# the parts of the load time, in order (StartedEngine.load_parts)
LOAD_PARTS = ("imports", "model", "engine", "warm_up")

# what a run's load counts as `imports`: this module (the engines, which bring torch) and
# transformers' model base, imported between the run's `since` and the model; the pipeline's
# own modules are imported before it
_BEFORE = "import jobrunner.pipeline"
_IMPORTS = "import jobrunner.engine.start; from transformers import PreTrainedModel"


def fresh_import_seconds() -> float | None:
    """The seconds a fresh interpreter takes for what a run's load counts as imports. For a
    process that has them imported already (`estimate --calibrate` loads the model after the
    estimate's own imports), so that the load it records is the load a run pays. None when the
    child fails."""
    code = f"import gc, time; gc.disable(); {_BEFORE}; t = time.monotonic(); {_IMPORTS}; "
    code += "print(time.monotonic() - t)"  # without collections, as `run` imports (collector.py)
    env = dict(os.environ)
    root = Path(__file__).resolve().parents[2]
    if (root / "pyproject.toml").exists():  # a source checkout: the child finds this copy
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    try:
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
        )
        if out.returncode == 0:
            return float(out.stdout.split()[-1])
        why = out.stderr.strip()[-300:]
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError) as e:
        why = str(e)
    log.warning(
        "could not time the imports in a fresh interpreter (%s): the load recorded leaves them out",
        why,
    )
    return None


@dataclass
class StartedEngine:
    loaded: LoadedModel
    engine: Engine
    weights: dict[str, Any]  # the run record's quantization and quality figures
    load_seconds: float  # from `since` to a ready engine
    # load_seconds split by LOAD_PARTS: imports (torch, transformers' model base, the
    # engines), model (its own code, the dtype choice, the weights mapped, the tokenizer),
    # engine (quality gate, quantization, the engine built: fused weights, KV cache), warm_up
    # (engine.warm_up: weights packed, kernels loaded); what ran between `since` and the call
    # (the engine modules' import, which brings torch) counts as imports
    load_parts: dict[str, float] = field(default_factory=dict)


class _Parts:
    """Seconds between marks, from a start time (time.monotonic)."""

    def __init__(self, since: float) -> None:
        self.since = self.last = since
        self.seconds: dict[str, float] = {}

    def mark(self, part: str) -> None:
        now = time.monotonic()
        self.seconds[part] = now - self.last
        self.last = now

    @property
    def total(self) -> float:
        return self.last - self.since


def start_engine(
    cfg: JobConfig, since: float | None = None, cpu_threads: int | None = None
) -> StartedEngine:
    """Raises ConfigError (78) for a model or format this device cannot run or token ids
    (generation.logit_bias, stop_token_ids) the model lacks, and
    QualityBelowThreshold (65) when the quantized model falls below the bar. `cpu_threads`:
    torch's threads on a CPU device, unless engine.num_threads sets them."""
    collector.pause()  # (and `run`'s, from its start) the imports and load make little garbage
    try:
        return _start(cfg, _Parts(time.monotonic() if since is None else since), cpu_threads)
    finally:
        collector.resume()


def _start(cfg: JobConfig, parts: _Parts, cpu_threads: int | None) -> StartedEngine:
    import torch
    from transformers import PreTrainedModel  # noqa: F401  (every model's base: timed apart)

    parts.mark("imports")
    loaded = loader.load_model(cfg.model)  # looked up here: tests stand in for it
    cfg.check_token_ids(len(loaded.tokenizer))  # before the quality gate, quantizing, warm-up
    if cpu_threads and loaded.device.type == "cpu" and not cfg.engine.num_threads:
        torch.set_num_threads(max(1, cpu_threads))
    parts.mark("model")
    weights = prepare_weights(loaded, cfg)
    engine = make_engine(loaded, cfg)
    check_engine(engine, cfg)
    parts.mark("engine")
    engine.warm_up()
    parts.mark("warm_up")
    return StartedEngine(loaded, engine, weights, parts.total, parts.seconds)
