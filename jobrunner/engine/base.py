"""The engine contract: Requests in (a stream), Results out (as rows finish).

Engines are looked up by name in ENGINES; `make_engine` picks the one the job asks for and falls
back to `static` (with a logged reason) when the paged engine does not cover the model.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from jobrunner.types import Request, Result

if TYPE_CHECKING:
    from jobrunner.config import JobConfig
    from jobrunner.engine.loader import LoadedModel

log = logging.getLogger(__name__)


@dataclass
class EngineStats:
    """Counters an engine keeps while it runs; the report and the cost model read them."""

    engine_seconds: float = 0.0  # wall time inside generate()
    forward_seconds: float = 0.0  # time in model forward passes (incl. sampling)
    steps: int = 0
    prefill_tokens: int = 0  # prompt tokens actually computed
    cached_tokens: int = 0  # prompt tokens served from the prefix cache
    decode_tokens: int = 0
    generated_tokens: int = 0  # tokens sampled so far, rows finished or not (live progress)
    preemptions: int = 0
    oom_retries: int = 0
    draft_tokens: int = 0  # speculative decoding: draft tokens computed
    accepted_draft_tokens: int = 0  # ... and kept (each saved a step for its row)
    num_kv_blocks: int = 0
    kv_bytes_per_token: int = 0
    step_log: list[dict[str, Any]] = field(default_factory=list)  # per-step records (telemetry)
    notes: list[str] = field(default_factory=list)  # e.g. fallback reasons

    @property
    def busy_fraction(self) -> float:
        return self.forward_seconds / self.engine_seconds if self.engine_seconds else 0.0


class Engine(ABC):
    """Generates completions. Results carry final text (stop strings applied, not included)."""

    kind: str = "?"

    def __init__(self, loaded: LoadedModel, cfg: JobConfig) -> None:
        self.loaded = loaded
        self.cfg = cfg
        self.stats = EngineStats()
        self._stop_requested = False

    @abstractmethod
    def generate(self, requests: Iterable[Request]) -> Iterator[Result]:
        """Yield one Result per request, in finishing order. Must honour request_stop()."""

    def request_stop(self) -> None:
        """Stop admitting work; generate() returns soon, dropping unfinished rows (rerun redoes them)."""
        self._stop_requested = True

    @classmethod
    def supports(cls, loaded: LoadedModel) -> str | None:
        """None when this engine can run the model, else the reason it cannot."""
        return None


ENGINES: dict[str, type[Engine]] = {}


def register(kind: str):
    def deco(cls: type[Engine]) -> type[Engine]:
        cls.kind = kind
        ENGINES[kind] = cls
        return cls

    return deco


def make_engine(loaded: LoadedModel, cfg: JobConfig) -> Engine:
    import jobrunner.engine.static  # noqa: F401  (registers)

    try:
        import jobrunner.engine.paged  # noqa: F401  (registers)
    except ImportError as e:  # pragma: no cover - only while the paged engine is absent
        log.debug("paged engine unavailable: %s", e)

    kind = cfg.engine.kind if cfg.engine.kind != "auto" else "paged"
    cls = ENGINES.get(kind)
    reason = "not available" if cls is None else cls.supports(loaded)
    if reason:
        log.warning("engine %r cannot run this model (%s); using the static engine", kind, reason)
        cls = ENGINES["static"]
        engine = cls(loaded, cfg)
        engine.stats.notes.append(f"fell back from {kind} to static: {reason}")
        return engine
    return cls(loaded, cfg)
