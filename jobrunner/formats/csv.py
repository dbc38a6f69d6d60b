"""CSV input (a header line, then rows); every value is read as a string, "" when empty.
`.tsv` and `.tab` files are CSV separated by tabs; the separator is io.csv_rows.file_delimiter's.

io.csv_rows cuts the file into rows: a bad row (ragged, not UTF-8) is its RowError and its
neighbours are read; RowRef.line is the physical line the row starts on.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from jobrunner.formats.base import Format
from jobrunner.io.csv_rows import Block, CsvRows
from jobrunner.io.readers import Item, RawRow, ReadOptions
from jobrunner.types import RowError, RowRef

SLICE_ROWS = 1024  # a fast-path block becomes dicts this many rows at a time


def read_csv(file: str, batch_rows: int, options: ReadOptions = ReadOptions()) -> Iterator[Item]:
    reader = CsvRows(file, options.delimiter)
    for part in reader.parts():
        if isinstance(part, Block):
            yield from _block_rows(file, part)
            continue
        ref = RowRef(file, part.row, part.line)
        if part.problem is None:
            yield RawRow(dict(zip(reader.header, part.fields, strict=True)), ref)
        else:
            code, message, column = part.problem
            yield RowError(code, f"{ref}: {message}", ref, field=column)


def _block_rows(file: str, block: Block) -> Iterator[RawRow]:
    for start in range(0, block.table.num_rows, SLICE_ROWS):
        at = block.row + start, block.line + start
        for k, values in enumerate(block.table.slice(start, SLICE_ROWS).to_pylist()):
            yield RawRow(values, RowRef(file, at[0] + k, at[1] + k))


def file_schema(file: str, options: ReadOptions = ReadOptions()) -> Any:
    """Every column a string (run_schema.py), named by the header."""
    import pyarrow as pa

    reader = CsvRows(file, options.delimiter)
    next(iter(reader.parts()), None)  # the header is known once the first part is out
    return pa.schema({name: pa.string() for name in reader.header or []})


FORMAT = Format(
    "csv", suffixes=(".csv", ".tsv", ".tab"), read=read_csv, compressed=True, schema=file_schema
)
