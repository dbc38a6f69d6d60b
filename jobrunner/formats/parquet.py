"""Parquet, in and out: read in record batches, a shard written as one table."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from jobrunner.errors import InputDataError
from jobrunner.formats.base import Format
from jobrunner.io.readers import Item, RawRow
from jobrunner.types import RowRef


def read_parquet(file: str, batch_rows: int) -> Iterator[Item]:
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(file)
    except Exception as e:  # pyarrow raises several types for a broken file
        raise InputDataError(f"{file}: not a readable Parquet file: {e}") from e
    row = 0
    for batch in pf.iter_batches(batch_size=batch_rows):
        for values in batch.to_pylist():
            yield RawRow(values, RowRef(file, row))
            row += 1


def write_parquet(records: list[dict[str, Any]], path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pa.Table.from_pylist(records)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        # Input columns of mixed types across rows: keep them, as JSON text.
        table = pa.Table.from_pylist([_jsonify_mixed(r) for r in records])
    pq.write_table(table, path)


def _jsonify_mixed(record: dict[str, Any]) -> dict[str, Any]:
    return {
        k: v if isinstance(v, (str, int, float, bool)) or v is None else json.dumps(v, default=str)
        for k, v in record.items()
    }


FORMAT = Format(
    "parquet",
    suffixes=(".parquet", ".pq"),
    read=read_parquet,
    write=write_parquet,
    suffix=".parquet",
)
