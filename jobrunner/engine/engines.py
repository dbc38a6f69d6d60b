"""The engines by `engine.kind`, and `make_engine`, which picks the one a job asks for.

It falls back to `static` (with a logged reason, and a note in the report) when the paged
engine does not cover the model. On CPU the heap keeps freed memory first (engine/heap.py), so
every engine, and a calibration's, runs its steps without fresh page faults.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from jobrunner.engine import heap
from jobrunner.engine.base import Engine
from jobrunner.engine.checkpoint import check_complete
from jobrunner.engine.paged import PagedEngine
from jobrunner.engine.static import StaticEngine
from jobrunner.errors import ConfigError
from jobrunner.registry import Registry

if TYPE_CHECKING:
    from jobrunner.config import JobConfig
    from jobrunner.engine.loader import LoadedModel

log = logging.getLogger(__name__)

ENGINES: Registry[type[Engine]] = Registry(
    "engine.kind", {e.kind: e for e in (PagedEngine, StaticEngine)}
)


def make_engine(loaded: LoadedModel, cfg: JobConfig) -> Engine:
    if loaded.device.type == "cpu":
        heap.keep_freed_memory()
    if cfg.task == "embed":  # prefill-only: one engine whatever engine.kind says
        from jobrunner.engine.embed.engine import EmbedEngine

        return EmbedEngine(loaded, cfg)
    if loaded.encoder:
        raise ConfigError(
            f"model.source: {loaded.source.name} is an encoder without a language-model head;"
            " it can only embed (set task: embed)"
        )
    archs = loaded.hf_config.architectures
    check_complete(set(loaded.missing_weights), loaded.weights_dir, archs)
    kind = cfg.engine.kind if cfg.engine.kind != "auto" else "paged"
    cls = ENGINES.get(kind)
    reason = cls.supports(loaded, cfg)
    if reason:
        log.warning("engine %r cannot run this model (%s); using the static engine", kind, reason)
        engine = ENGINES.get("static")(loaded, cfg)
        engine.stats.notes.append(f"fell back from {kind} to static: {reason}")
        return engine
    return cls(loaded, cfg)
