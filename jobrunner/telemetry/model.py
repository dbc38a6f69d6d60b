"""The report as stored (report.json), and the per-row columns the report reads from shards."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from jobrunner.io.rundir import RunDir

REPORT_FILE = "report.json"
TOKEN_COLUMNS = ["prompt_tokens", "cached_tokens", "completion_tokens", "cost_usd", "finish_reason"]


def iter_token_columns(rundir: RunDir) -> Iterator[dict[str, Any]]:
    """Each committed row's TOKEN_COLUMNS (None where a shard lacks one)."""
    import pyarrow.parquet as pq

    for f in rundir.shard_files():
        if f.suffix == ".parquet":
            yield from pq.read_table(f, columns=TOKEN_COLUMNS).to_pylist()
        else:
            with open(f, encoding="utf-8") as fh:
                for line in fh:
                    if line.strip():
                        rec = json.loads(line)
                        yield {k: rec.get(k) for k in TOKEN_COLUMNS}


def load_report(path: str | Path) -> dict[str, Any]:
    return json.loads((Path(path) / REPORT_FILE).read_text(encoding="utf-8"))
