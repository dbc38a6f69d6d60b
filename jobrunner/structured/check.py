"""The job's own structured output, checked before any row or model: a `generation.
response_format`, `choice` or `regex` that xgrammar cannot compile is the job file's error
(78), not every row's. A row's own spec (a batch line's, a column's) stays that row's error."""

from __future__ import annotations

import functools

from jobrunner.errors import ConfigError
from jobrunner.structured.spec import OutputSpec, generation_spec


def check_job_spec(cfg) -> None:
    """Raise ConfigError when the job's spec does not compile; import xgrammar only for a job
    that has one."""
    g = cfg.generation
    spec = generation_spec(g.response_format, g.choice, g.regex)
    if spec is None:
        return
    from jobrunner.structured.grammar import GrammarError, grammar_of

    try:
        grammar_of(spec)
    except GrammarError as e:
        where = f"{cfg.source_file}: " if cfg.source_file else ""
        raise ConfigError(
            f"{where}{str(e).rstrip('.')}: every row would fail; change it to what xgrammar"
            " supports (docs/DESIGN.md, 'OpenAI batch files and structured outputs')"
        ) from e


def spec_error(spec: OutputSpec) -> str | None:
    """Why a row's own spec does not compile (what the run would fail the row with), or None:
    `validate` counts such rows as the run would."""
    return _compile_error(spec.kind, spec.source, spec.where)


@functools.lru_cache(maxsize=1024)  # rows mostly share a few specs; compiling one takes ms
def _compile_error(kind: str, source: str, where: str) -> str | None:
    from jobrunner.structured.grammar import GrammarError, grammar_of

    try:
        grammar_of(OutputSpec(kind, source, where=where))
    except GrammarError as e:
        return str(e)
    return None
