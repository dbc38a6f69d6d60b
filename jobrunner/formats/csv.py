"""CSV input (a header line, then rows); every column is read as a string."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from jobrunner.errors import InputDataError
from jobrunner.formats.base import Format
from jobrunner.io.fs import open_file
from jobrunner.io.readers import Item, RawRow
from jobrunner.types import RowRef


def read_csv(file: str, batch_rows: int) -> Iterator[Item]:
    import pyarrow as pa
    import pyarrow.csv as pcsv

    opts = pcsv.ReadOptions(block_size=1 << 20)
    # Strings stay strings: an id column of digits must not become an integer.
    convert = pcsv.ConvertOptions(column_types=_all_strings(file), strings_can_be_null=False)
    try:
        stream = pcsv.open_csv(open_file(file), read_options=opts, convert_options=convert)
    except (pa.ArrowInvalid, OSError) as e:
        raise InputDataError(f"{file}: not a readable CSV file: {e}") from e
    row = 0
    while True:
        try:
            batch = stream.read_next_batch()
        except StopIteration:
            return
        except (pa.ArrowInvalid, OSError) as e:  # e.g. a row with too many fields
            raise InputDataError(
                f"{file}: unreadable after line {row + 1} ({e}); the lines before it are read."
                " Repair the file and run again"
            ) from e
        for values in batch.to_pylist():
            yield RawRow(values, RowRef(file, row, line=row + 2))  # +1 header, 1-based
            row += 1


def _all_strings(file: str) -> dict[str, Any]:
    import csv
    import io

    import pyarrow as pa

    with open_file(file) as raw:
        text = io.TextIOWrapper(raw, encoding="utf-8", errors="replace", newline="")
        header = next(csv.reader(text), [])
    return {name: pa.string() for name in header}


def file_schema(file: str) -> Any:
    import pyarrow as pa

    return pa.schema(_all_strings(file))


FORMAT = Format("csv", suffixes=(".csv",), read=read_csv, schema=file_schema)
