"""Write one result shard atomically: a temporary name, flush + fsync, then rename.

Writers are looked up by output format; each writes a list of plain records to one path.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jobrunner.types import Result

Writer = Callable[[list[dict[str, Any]], Path], None]
WRITERS: dict[str, Writer] = {}
SUFFIX = {"parquet": ".parquet", "jsonl": ".jsonl"}


def writer(fmt: str):
    def deco(fn: Writer) -> Writer:
        WRITERS[fmt] = fn
        return fn

    return deco


def result_record(r: Result, model: str) -> dict[str, Any]:
    """The result row: input columns first, then the result columns of DESIGN.md."""
    return {
        **r.columns,
        "id": r.id,
        "completion": r.completion,
        "finish_reason": r.finish_reason.value,
        "prompt_tokens": r.usage.prompt_tokens,
        "cached_tokens": r.usage.cached_tokens,
        "completion_tokens": r.usage.completion_tokens,
        "cost_usd": r.usage.cost_usd,
        "model": model,
    }


def write_atomic(records: list[dict[str, Any]], path: Path, fmt: str) -> None:
    """`path` appears complete or not at all."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        WRITERS[fmt](records, tmp)
        fsync_file(tmp)
        os.replace(tmp, path)
        fsync_dir(path.parent)
    finally:
        tmp.unlink(missing_ok=True)


def write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@writer("parquet")
def write_parquet(records: list[dict[str, Any]], path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pa.Table.from_pylist(records)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        # Input columns of mixed types across rows: keep them, as JSON text.
        table = pa.Table.from_pylist([_jsonify_mixed(r) for r in records])
    pq.write_table(table, path)


@writer("jsonl")
def write_jsonl(records: list[dict[str, Any]], path: Path) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False, default=str) + "\n")


def _jsonify_mixed(record: dict[str, Any]) -> dict[str, Any]:
    return {
        k: v if isinstance(v, (str, int, float, bool)) or v is None else json.dumps(v, default=str)
        for k, v in record.items()
    }
