"""Parquet, in and out: read in record batches, a shard written as one table."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from jobrunner.errors import InputDataError
from jobrunner.formats.base import Format
from jobrunner.formats.columns import is_json_text, json_dumps, storable
from jobrunner.io.fs import is_remote, open_file
from jobrunner.io.readers import Item, RawRow, ReadOptions
from jobrunner.io.store_errors import from_store_error
from jobrunner.types import RowError, RowRef


def read_parquet(
    file: str, batch_rows: int, options: ReadOptions = ReadOptions()
) -> Iterator[Item]:
    row = 0
    pf = open_parquet(file)
    batches = pf.iter_batches(batch_size=batch_rows)
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except Exception as e:  # a row group that does not decode: the file went bad here
            raise from_store_error(e, file) or InputDataError(
                f"{file}: unreadable from row {row} on ({type(e).__name__}: {e}); the rows"
                " before it are read. Repair or replace the file and run again"
            ) from e
        for item in _batch_rows(batch, file, row):
            yield item
            row += 1


def _batch_rows(batch: Any, file: str, first: int) -> Iterator[Item]:
    return raw_rows(batch, [RowRef(file, first + i) for i in range(batch.num_rows)])


def raw_rows(batch: Any, refs: list[RowRef]) -> Iterator[Item]:
    """A batch's rows, one per ref; when it does not convert, row by row, so one bad value
    fails one row."""
    try:
        rows = batch.to_pylist()
        exact = _exact_values(batch)
    except Exception:
        rows = None
    for i, ref in enumerate(refs):
        if rows is not None:
            yield RawRow(rows[i], ref, exact[i] if exact else None)
            continue
        try:
            one = batch.slice(i, 1)
            yield RawRow(one.to_pylist()[0], ref, (_exact_values(one) or [None])[0])
        except Exception as e:
            yield RowError("bad_value", f"{ref}: a value does not convert: {e}", ref)


def _exact_values(batch: Any) -> list[dict[str, Any]] | None:
    """Per row, the values whose Python form drops digits (time64[ns]: datetime.time holds
    microseconds) as Arrow scalars, which the result writer takes back exactly; None if none."""
    import pyarrow as pa

    lossy = [f.name for f in batch.schema if f.type == pa.time64("ns")]
    if not lossy:
        return None
    cols = {n: batch.column(n) for n in lossy}
    return [
        {n: (c[i] if c[i].is_valid else None) for n, c in cols.items()}
        for i in range(batch.num_rows)
    ]


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
    """A Parquet file, a local path or a store URL. INT96 timestamps (Spark's, Hive's and
    Impala's legacy type) are read in microseconds, as Spark reads them: in nanoseconds,
    pyarrow's default, a date past 2262 (a warehouse's 9999-12-31 'valid to') wraps round to
    a wrong date without a word."""
    import pyarrow.parquet as pq

    try:
        source = file if not is_remote(file) else open_file(file)
        pf = pq.ParquetFile(source, coerce_int96_timestamp_unit="us")
    except Exception as e:  # pyarrow raises several types for a broken file
        user = from_store_error(e, file)  # or the store failed, not the file
        raise user or InputDataError(f"{file}: not a readable Parquet file: {e}") from e
    _check_names(file, pf.schema_arrow.names)
    return pf


def _check_names(file: str, names: list[str]) -> None:
    """Two columns of one name (pyarrow writes them) would leave a row one of the values."""
    counts = Counter(names)
    twice = sorted(n for n, k in counts.items() if k > 1)
    if twice:
        raise InputDataError(
            f"{file}: the column name {twice[0]!r} is used by {counts[twice[0]]} columns"
            " (a row would keep one of their values); rename them apart and run again"
        )


def read_parquet_batches(file: str, batch_rows: int) -> Iterator[Any]:
    """A Parquet file (a local path or a store URL) as Arrow record batches."""
    yield from open_parquet(file).iter_batches(batch_size=batch_rows)


def write_parquet(records: list[dict[str, Any]], path: Path, schema: Any = None) -> None:
    import pyarrow.parquet as pq

    pq.write_table(embedding_column(parquet_table(records, schema)), path)


def file_schema(file: str, options: ReadOptions = ReadOptions()) -> Any:
    """The Arrow schema of a Parquet file's columns (its footer)."""
    return open_parquet(file).schema_arrow


def embedding_column(table):
    """An `embedding` column (task: embed) as fixed_size_list<float32>[d] when every vector has
    d values (else list<float32>): the layout vector stores and numpy read without a per-row
    copy."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if "embedding" not in table.column_names:
        return table
    col = table.column("embedding")
    if pa.types.is_null(col.type):  # a shard whose every row failed
        lens = []
    else:
        lens = pc.unique(pc.list_value_length(col)).drop_null().to_pylist()
    kind = pa.list_(pa.float32(), lens[0]) if len(lens) == 1 else pa.list_(pa.float32())
    i = table.column_names.index("embedding")
    return table.set_column(i, "embedding", col.cast(kind))


def parquet_table(records: list[dict[str, Any]], schema: Any = None):
    """The records as one table. With the run's `schema` (run_schema.py), its columns in its
    order and types, a JSON-text field's values as their JSON; a value that does not fit its
    type raises (the committer fails that row alone). Keys the schema lacks, or every key
    without one, follow as before: typed by their values, or JSON text where they share no
    type Parquet stores."""
    import pyarrow as pa

    fields = list(schema) if schema is not None else []
    known = {f.name for f in fields}
    arrays = [_typed(f, [r.get(f.name) for r in records]) for f in fields]
    for name in dict.fromkeys(k for r in records for k in r if k not in known):
        arrays.append(_inferred([r.get(name) for r in records]))
        fields.append(pa.field(name, arrays[-1].type))
    if not fields:
        return pa.table({"id": pa.array([], pa.string())})
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


def _typed(field: Any, values: list[Any]):
    import pyarrow as pa

    if is_json_text(field):
        return pa.array([None if v is None else json_dumps(v) for v in values], pa.string())
    return pa.array(values, field.type)


def _inferred(values: list[Any]):
    import pyarrow as pa

    try:
        arr = pa.array(values)
        if not storable(arr.type):
            raise pa.ArrowNotImplementedError(f"{arr.type} cannot be stored")
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError):
        arr = pa.array([_as_text(v) for v in values], pa.string())
    return arr


def _as_text(v: Any) -> str | None:
    return v if isinstance(v, str) or v is None else json.dumps(v, default=str)


FORMAT = Format(
    "parquet",
    suffixes=(".parquet", ".pq"),
    read=read_parquet,
    write=write_parquet,
    suffix=".parquet",
    schema=file_schema,
    typed=True,
)
