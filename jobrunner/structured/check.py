"""The job's own structured output, checked before any row or model: a `generation.
response_format`, `choice` or `regex` that xgrammar cannot compile is the job file's error
(78), not every row's. A row's own spec (a batch line's, a column's) stays that row's error."""

from __future__ import annotations

from jobrunner.errors import ConfigError
from jobrunner.structured.spec import generation_spec


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
