"""A shard less its failed rows (`finish_reason: error`), as --retry-errors leaves it.

Both run-directory kinds use it: a local one rewrites the shard in place (atomically), a store's
writes the bytes as a new object and supersedes the old one by a commit record.
"""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass
class Kept:
    """What is left of a shard: its bytes (None when every row failed), rows and failed cost."""

    data: bytes | None
    rows: int
    failed_cost_usd: float


def without_failed(data: bytes, suffix: str) -> Kept:
    """The shard `data` (of format `suffix`, .parquet or .jsonl) less its failed rows."""
    return _parquet(data) if suffix == ".parquet" else _jsonl(data)


def _parquet(data: bytes) -> Kept:
    """Filtered as a table: the shard keeps its schema (and its columns' types)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    table = pq.read_table(pa.BufferReader(data))
    ok = pc.fill_null(pc.not_equal(table["finish_reason"], "error"), True)
    kept, failed = table.filter(ok), table.filter(pc.invert(ok))
    cost = pc.sum(failed["cost_usd"]).as_py() if "cost_usd" in table.column_names else 0.0
    if not len(kept):
        return Kept(None, 0, cost or 0.0)
    out = pa.BufferOutputStream()
    pq.write_table(kept, out)
    return Kept(out.getvalue().to_pybytes(), len(kept), cost or 0.0)


def _jsonl(data: bytes) -> Kept:
    """The kept lines are the shard's own bytes, not written again."""
    kept, cost = [], 0.0
    for line in data.splitlines(keepends=True):
        if not line.strip():
            continue
        rec = json.loads(line)
        if rec.get("finish_reason") == "error":
            cost += rec.get("cost_usd") or 0.0
        else:
            kept.append(line if line.endswith(b"\n") else line + b"\n")
    return Kept(b"".join(kept) if kept else None, len(kept), cost)
