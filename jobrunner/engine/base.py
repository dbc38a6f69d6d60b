"""The engine contract: Requests in (a stream), Results out (as rows finish).

The engines are registered in engine/engines.py, which picks the one a job asks for.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from jobrunner.engine.samples import Samples
from jobrunner.telemetry.spill import SpillLog
from jobrunner.telemetry.timeline import STEP_COLUMNS
from jobrunner.types import Request, Result

if TYPE_CHECKING:
    from jobrunner.config import JobConfig
    from jobrunner.engine.loader import LoadedModel


@dataclass
class EngineStats:
    """Counters an engine keeps while it runs; the report and the cost model read them."""

    engine_seconds: float = 0.0  # wall time inside generate()
    forward_seconds: float = 0.0  # time in model forward passes (incl. sampling)
    row_seconds: float = 0.0  # measured step time shared out to rows (Usage.device_seconds)
    steps: int = 0
    prefill_tokens: int = 0  # prompt tokens actually computed
    cached_tokens: int = 0  # prompt tokens not computed for their row: from the prefix cache,
    # or shared with the row that computed them in the same step
    decode_tokens: int = 0
    generated_tokens: int = 0  # tokens sampled so far, rows finished or not (live progress)
    preemptions: int = 0
    oom_retries: int = 0
    draft_tokens: int = 0  # speculative decoding: draft tokens computed
    accepted_draft_tokens: int = 0  # ... and kept (each saved a step for its row)
    num_kv_blocks: int = 0
    kv_bytes_per_token: int = 0
    # per-step records (telemetry), in bounded memory: full chunks go to Parquet part files
    step_log: SpillLog = field(default_factory=lambda: SpillLog(STEP_COLUMNS))
    notes: list[str] = field(default_factory=list)  # e.g. fallback reasons

    @property
    def busy_fraction(self) -> float:
        return self.forward_seconds / self.engine_seconds if self.engine_seconds else 0.0


class Engine:
    """Generates completions. Results carry final text (stop strings applied, not included)."""

    kind: str = "?"

    def __init__(self, loaded: LoadedModel, cfg: JobConfig) -> None:
        self.loaded = loaded
        self.cfg = cfg
        self.stats = EngineStats()
        self._stop_requested = False
        self._grammars = None  # structured.grammar.Grammars, made with the first constrained row

    def generate(self, requests: Iterable[Request]) -> Iterator[Result]:
        """Yield one Result per request, in finishing order (a row's n samples as one Result
        with n choices). Honours request_stop()."""
        samples = Samples()
        yield from samples.gather(self.run_samples(samples.split(requests)))

    def run_samples(self, requests: Iterable[Request]) -> Iterator[Result]:
        """Yield one Result per request, each one sample (`Request.sample_index`), in finishing
        order. Must honour request_stop(). (An engine overriding `generate` itself needs not.)"""
        raise NotImplementedError

    @property
    def grammars(self):
        """The compiled grammars for this model's tokenizer (structured.grammar.Grammars), made
        with the first constrained row: xgrammar takes about a second to import."""
        if self._grammars is None:
            from jobrunner.structured.grammar import Grammars

            vocab = self.loaded.hf_config.vocab_size  # the logits width
            eos = frozenset(self.loaded.eos_token_ids)
            self._grammars = Grammars(self.loaded.tokenizer, vocab, eos)
        return self._grammars

    def compile_grammar(self, spec) -> None:
        """Compile a row's spec ahead (the prep thread calls it); raises GrammarError."""
        self.grammars.compile(spec)

    @property
    def stop_requested(self) -> bool:
        return self._stop_requested

    def warm_up(self) -> None:
        """Do the one-off work of a first step before the first row (engine/start.py calls it,
        inside the load time). Default: nothing."""

    def reset_stats(self) -> None:
        """Fresh counters, the cache's size and the notes kept: what ran before (a warm-up)
        is not the next rows' work."""
        old = self.stats
        self.stats = EngineStats(
            num_kv_blocks=old.num_kv_blocks, kv_bytes_per_token=old.kv_bytes_per_token
        )
        self.stats.notes = old.notes
        old.step_log.close()

    def request_stop(self) -> None:
        """Stop admitting work; generate() returns soon, dropping unfinished rows (rerun redoes them)."""
        self._stop_requested = True

    @classmethod
    def supports(cls, loaded: LoadedModel, cfg: JobConfig) -> str | None:
        """None when this engine can run the model for this job, else the reason it cannot."""
        return None


def model_context(loaded: LoadedModel, cfg: JobConfig) -> int:
    """The tokens a row may hold, prompt and output: model.max_model_len, capped at the
    model's own context (max_position_embeddings: past it a learned position table has no
    row, and RoPE scaling was not trained), on every engine."""
    own = getattr(loaded.hf_config, "max_position_embeddings", None) or 1 << 30
    return min(cfg.model.max_model_len, own)
