"""`jobrunner validate`: the job and its input checked end to end, without loading weights."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any

from jobrunner.config import JobConfig
from jobrunner.engine.loader import load_tokenizer
from jobrunner.errors import ConfigError, InputDataError
from jobrunner.formats import job_rows, make_preparer
from jobrunner.resume import describe_duplicates, scan_ids
from jobrunner.structured.check import spec_error
from jobrunner.types import RowError

MAX_SHOWN = 20


def validate_job(cfg: JobConfig) -> dict[str, Any]:
    """Summary of rows, tokens and errors; raises InputDataError over the error budget."""
    import sys

    output = check_output(cfg)
    total, duplicates = scan_ids(cfg)
    if duplicates:
        raise InputDataError(describe_duplicates(cfg, duplicates))
    preparer = make_preparer(cfg, load_tokenizer(cfg.model))
    codes: Counter[str] = Counter()
    valid = prompt_tokens = max_prompt_tokens = 0  # running totals: nothing kept per row
    for item in preparer.prepare(job_rows(cfg.input)):
        item = _runnable(item)
        if isinstance(item, RowError):
            codes[item.code] += 1
            if sum(codes.values()) <= MAX_SHOWN:
                print(f"  {item.code}: {item.message}", file=sys.stderr)
        else:
            valid += 1
            prompt_tokens += item.num_prompt_tokens
            max_prompt_tokens = max(max_prompt_tokens, item.num_prompt_tokens)
    failed = sum(codes.values())
    summary = {
        "status": "ok",
        "rows": total,
        "valid": valid,
        "invalid": failed,
        "errors_by_code": dict(codes),
        "prompt_tokens": prompt_tokens,
        "max_prompt_tokens": max_prompt_tokens,
        "max_new_tokens": cfg.generation.max_new_tokens,
        "output": cfg.output.path,
        "output_state": output,
    }
    if total and failed / total > cfg.input.max_error_rate:
        raise InputDataError(
            f"{failed} of {total} rows are invalid (over input.max_error_rate"
            f" {cfg.input.max_error_rate:.1%}): {dict(codes)}"
        )
    return summary


def _runnable(item: Any) -> Any:
    """A request whose own structured output (a batch line's, a column's) does not compile is
    the bad_schema error the run would fail it with."""
    spec = None if isinstance(item, RowError) else item.sampling.structured
    why = spec_error(spec) if spec is not None else None
    if why is None:
        return item
    return RowError("bad_schema", f"{item.source}: {why}", item.source, item.id, spec.where)


def check_output(cfg: JobConfig) -> str:
    """Whether `run` can write output.path: "new", "resumes" or "finished"; an error (78) if not,
    by the checks `run` makes (lifecycle.output_state), after a local folder's writability."""
    from jobrunner.lifecycle import output_state

    if "://" not in cfg.output.path:
        _check_writable(Path(cfg.output.path))
    return output_state(cfg)


def _check_writable(path: Path) -> None:
    if path.exists() and not path.is_dir():
        raise ConfigError(f"output.path: {path} is a file; the run directory must be a folder")
    if not path.exists():
        parent = next(p for p in path.parents if p.exists())
        if not (parent.is_dir() and os.access(parent, os.W_OK | os.X_OK)):
            raise ConfigError(f"output.path: cannot create {path}: {parent} is not writable")
    elif not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(f"output.path: {path} is not writable")


def to_text(summary: dict[str, Any]) -> str:
    """The validation for a person (stderr); the JSON summary goes to stdout."""
    state = {
        "new": "a new run directory",
        "resumes": "holds an earlier run of this job: `run` continues it",
        "finished": "holds this job, finished: `run` does nothing (--restart to redo it)",
    }[summary["output_state"]]
    codes = ", ".join(f"{k}: {v}" for k, v in summary["errors_by_code"].items())
    return "\n".join(
        [
            f"{summary['rows']:,} rows: {summary['valid']:,} valid, {summary['invalid']:,} invalid"
            + (f" ({codes})" if codes else ""),
            f"  prompt tokens   {summary['prompt_tokens']:,} (longest"
            f" {summary['max_prompt_tokens']:,}), up to {summary['max_new_tokens']:,} new per row",
            f"  output          {summary['output']}: {state}",
        ]
    )
