"""`jobrunner validate`: the job and its input checked end to end, without loading weights."""

from __future__ import annotations

from collections import Counter
from typing import Any

from jobrunner.config import JobConfig
from jobrunner.errors import InputDataError
from jobrunner.formats import read_rows
from jobrunner.types import RowError

MAX_SHOWN = 20


def validate_job(cfg: JobConfig) -> dict[str, Any]:
    """Summary of rows, tokens and errors; raises InputDataError over the error budget."""
    import sys

    from jobrunner.engine.loader import load_tokenizer
    from jobrunner.formats import make_preparer
    from jobrunner.resume import describe_duplicates, scan_ids

    total, duplicates = scan_ids(cfg)
    if duplicates:
        raise InputDataError(describe_duplicates(duplicates))
    preparer = make_preparer(cfg, load_tokenizer(cfg.model))
    codes: Counter[str] = Counter()
    lengths: list[int] = []
    for item in preparer.prepare(read_rows(cfg.input.path, cfg.input.format, cfg.input.batch_rows)):
        if isinstance(item, RowError):
            codes[item.code] += 1
            if sum(codes.values()) <= MAX_SHOWN:
                print(f"  {item.code}: {item.message}", file=sys.stderr)
        else:
            lengths.append(item.num_prompt_tokens)
    failed = sum(codes.values())
    summary = {
        "status": "ok",
        "rows": total,
        "valid": len(lengths),
        "invalid": failed,
        "errors_by_code": dict(codes),
        "prompt_tokens": sum(lengths),
        "max_prompt_tokens": max(lengths, default=0),
        "max_new_tokens": cfg.generation.max_new_tokens,
    }
    if total and failed / total > cfg.input.max_error_rate:
        raise InputDataError(
            f"{failed} of {total} rows are invalid (over input.max_error_rate"
            f" {cfg.input.max_error_rate:.1%}): {dict(codes)}"
        )
    return summary
