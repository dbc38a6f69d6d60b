"""Parquet, in and out: read in record batches, a shard written as one table."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from jobrunner.errors import InputDataError
from jobrunner.formats.base import Format
from jobrunner.io.fs import is_remote, open_file
from jobrunner.io.readers import Item, RawRow
from jobrunner.types import RowError, RowRef


def read_parquet(file: str, batch_rows: int) -> Iterator[Item]:
    row = 0
    pf = open_parquet(file)
    batches = pf.iter_batches(batch_size=batch_rows)
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except Exception as e:  # a row group that does not decode: the file went bad here
            raise InputDataError(
                f"{file}: unreadable from row {row} on ({type(e).__name__}: {e}); the rows"
                " before it are read. Repair or replace the file and run again"
            ) from e
        for item in _batch_rows(batch, file, row):
            yield item
            row += 1


def _batch_rows(batch: Any, file: str, first: int) -> Iterator[Item]:
    """A batch's rows; when it does not convert, row by row, so one bad value fails one row."""
    try:
        rows = batch.to_pylist()
    except Exception:
        rows = None
    for i in range(batch.num_rows):
        ref = RowRef(file, first + i)
        if rows is not None:
            yield RawRow(rows[i], ref)
            continue
        try:
            yield RawRow(batch.slice(i, 1).to_pylist()[0], ref)
        except Exception as e:
            yield RowError("bad_value", f"{ref}: a value does not convert: {e}", ref)


def read_parquet_ranges(
    file: str, ranges: list[tuple[int, int]], batch_rows: int
) -> Iterator[Item]:
    """The rows [start, stop) of each range, reading only the row groups that hold them; rows
    are named as read_parquet names them (a Ray block: its file and row ranges)."""
    import numpy as np

    pf = open_parquet(file)
    md = pf.metadata
    bounds = np.cumsum([0, *(md.row_group(g).num_rows for g in range(md.num_row_groups))])
    for start, stop in ranges:
        first_group = int(np.searchsorted(bounds, start, "right")) - 1
        last_group = int(np.searchsorted(bounds, stop, "left"))
        first = int(bounds[first_group])
        groups = list(range(first_group, last_group))
        for batch in pf.iter_batches(batch_size=batch_rows, row_groups=groups):
            lo, hi = max(start - first, 0), min(stop - first, batch.num_rows)
            if lo < hi:
                yield from _batch_rows(batch.slice(lo, hi - lo), file, first + lo)
            first += batch.num_rows
            if first >= stop:
                break


def open_parquet(file: str) -> Any:
    """A Parquet file, a local path or a store URL."""
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(file if not is_remote(file) else open_file(file))
    except Exception as e:  # pyarrow raises several types for a broken file
        raise InputDataError(f"{file}: not a readable Parquet file: {e}") from e


def read_parquet_batches(file: str, batch_rows: int) -> Iterator[Any]:
    """A Parquet file (a local path or a store URL) as Arrow record batches."""
    yield from open_parquet(file).iter_batches(batch_size=batch_rows)


def write_parquet(records: list[dict[str, Any]], path: Path) -> None:
    import pyarrow.parquet as pq

    pq.write_table(embedding_column(parquet_table(records)), path)


def embedding_column(table):
    """An `embedding` column (task: embed) as fixed_size_list<float32>[d] when every vector has
    d values (else list<float32>): the layout vector stores and numpy read without a per-row
    copy."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if "embedding" not in table.column_names:
        return table
    col = table.column("embedding")
    lens = pc.unique(pc.list_value_length(col)).drop_null().to_pylist()
    kind = pa.list_(pa.float32(), lens[0]) if len(lens) == 1 else pa.list_(pa.float32())
    i = table.column_names.index("embedding")
    return table.set_column(i, "embedding", col.cast(kind))


def parquet_table(records: list[dict[str, Any]]):
    """The records as one table: every key any record has is a column (a key first seen in a
    later record is kept), each column typed by its values; a column whose values share no
    Arrow type Parquet can store and read back becomes JSON text."""
    import pyarrow as pa

    names = list(dict.fromkeys(k for r in records for k in r))
    columns = {}
    for name in names:
        values = [r.get(name) for r in records]
        try:
            arr = pa.array(values)
            if not _storable(arr.type):
                raise pa.ArrowNotImplementedError(f"{arr.type} cannot be stored")
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError):
            arr = pa.array([_as_text(v) for v in values], pa.string())
        columns[name] = arr
    return pa.table(columns) if columns else pa.table({"id": pa.array([], pa.string())})


MAX_DEPTH = 32  # Parquet readers refuse schemas nested past 100 levels (each list is two)


def _storable(t, depth: int = 0) -> bool:
    """Parquet cannot store a struct without fields, nor read back very deep nesting."""
    import pyarrow as pa

    if depth > MAX_DEPTH or (pa.types.is_struct(t) and t.num_fields == 0):
        return False
    kids = [t.field(i).type for i in range(t.num_fields)] if t.num_fields else []
    if hasattr(t, "value_type"):
        kids.append(t.value_type)
    return all(_storable(k, depth + 1) for k in kids)


def _as_text(v: Any) -> str | None:
    return v if isinstance(v, str) or v is None else json.dumps(v, default=str)


FORMAT = Format(
    "parquet",
    suffixes=(".parquet", ".pq"),
    read=read_parquet,
    write=write_parquet,
    suffix=".parquet",
)
