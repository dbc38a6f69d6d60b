"""The report as stored (report.json), and the per-row columns the report reads from shards."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from jobrunner.io.rundir import RunDir, read_columns

REPORT_FILE = "report.json"
TOKEN_COLUMNS = ["prompt_tokens", "cached_tokens", "completion_tokens", "cost_usd", "finish_reason"]


def iter_token_columns(rundir: RunDir) -> Iterator[dict[str, Any]]:
    """Each committed row's TOKEN_COLUMNS (None where a JSONL shard lacks one); shards may be
    local files or store URLs."""
    for f in rundir.shard_files():
        yield from read_columns(f, TOKEN_COLUMNS)


def load_report(path: str | Path) -> dict[str, Any]:
    return json.loads((Path(path) / REPORT_FILE).read_text(encoding="utf-8"))
