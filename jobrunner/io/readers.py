"""Stream input rows from Parquet, JSONL and CSV files (a file, a directory or a glob).

A reader yields `RawRow`s (the row's values and where it came from) or `RowError`s for rows
that cannot even be parsed (malformed JSON, invalid UTF-8, a line that is not an object); the
lines around a bad one are still read. Nothing is held beyond one batch.
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jobrunner.errors import InputDataError
from jobrunner.types import RowError, RowRef

EXTENSIONS = {
    ".parquet": "parquet",
    ".pq": "parquet",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "jsonl",
    ".csv": "csv",
}


@dataclass
class RawRow:
    values: dict[str, Any]
    source: RowRef


Item = RawRow | RowError
BOM = b"\xef\xbb\xbf"
Reader = Callable[[str, int], Iterator[Item]]
READERS: dict[str, Reader] = {}


def reader(fmt: str):
    def deco(fn: Reader) -> Reader:
        READERS[fmt] = fn
        return fn

    return deco


def input_files(path: str) -> list[str]:
    """The files a job reads, in a stable order: a file, every supported file in a dir, a glob."""
    p = Path(path).expanduser()
    if p.is_file():
        return [str(p)]
    if p.is_dir():
        files = sorted(str(f) for f in p.rglob("*") if f.is_file() and f.suffix in EXTENSIONS)
    else:
        files = sorted(
            f for f in glob.glob(os.path.expanduser(path), recursive=True) if os.path.isfile(f)
        )
    if not files:
        raise InputDataError(f"input.path: no input files found at {path!r}")
    return files


def detect_format(file: str, fmt: str) -> str:
    if fmt != "auto":
        return fmt
    suffix = Path(file).suffix.lower()
    if suffix not in EXTENSIONS:
        raise InputDataError(f"{file}: cannot tell the format from {suffix!r}; set input.format")
    kind = EXTENSIONS[suffix]
    return "openai-batch" if kind == "jsonl" and _looks_like_openai_batch(file) else kind


def resolve_format(path: str, fmt: str) -> str:
    """The job's input format, with `auto` resolved from the first input file."""
    return fmt if fmt != "auto" else detect_format(input_files(path)[0], fmt)


def _looks_like_openai_batch(file: str) -> bool:
    """An OpenAI Batch API input file: its first line has custom_id, url and body."""
    with open(file, "rb") as f:
        for raw in f:
            if raw.strip():
                try:
                    first = json.loads(raw)
                except ValueError:
                    return False
                return isinstance(first, dict) and {"custom_id", "body", "url"} <= first.keys()
    return False


def read_rows(path: str, fmt: str = "auto", batch_rows: int = 1024) -> Iterator[Item]:
    for file in input_files(path):
        kind = detect_format(file, fmt)
        yield from READERS[kind if kind in READERS else "jsonl"](file, batch_rows)


@reader("parquet")
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


@reader("csv")
def read_csv(file: str, batch_rows: int) -> Iterator[Item]:
    import pyarrow as pa
    import pyarrow.csv as pcsv

    opts = pcsv.ReadOptions(block_size=1 << 20)
    # Strings stay strings: an id column of digits must not become an integer.
    convert = pcsv.ConvertOptions(column_types=_all_strings(file), strings_can_be_null=False)
    try:
        stream = pcsv.open_csv(file, read_options=opts, convert_options=convert)
    except (pa.ArrowInvalid, OSError) as e:
        raise InputDataError(f"{file}: not a readable CSV file: {e}") from e
    row = 0
    for batch in stream:
        for values in batch.to_pylist():
            yield RawRow(values, RowRef(file, row, line=row + 2))  # +1 header, 1-based
            row += 1


def _all_strings(file: str) -> dict[str, Any]:
    import csv

    import pyarrow as pa

    with open(file, newline="", encoding="utf-8", errors="replace") as f:
        header = next(csv.reader(f), [])
    return {name: pa.string() for name in header}


@reader("jsonl")
def read_jsonl(file: str, batch_rows: int) -> Iterator[Item]:
    with open(file, "rb") as f:
        row = 0
        for lineno, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            ref = RowRef(file, row, line=lineno)
            row += 1
            # Windows tools (and Azure's samples) start a file with a UTF-8 byte-order mark.
            yield parse_json_line(raw.removeprefix(BOM) if lineno == 1 else raw, ref)


def parse_json_line(raw: bytes, ref: RowRef) -> Item:
    """One line's object. Error columns are 1-based characters, as an editor counts them."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        column = len(raw[: e.start].decode("utf-8", errors="replace")) + 1
        return RowError(
            "invalid_utf8", f"{ref}: the line is not valid UTF-8 at column {column}", ref
        )
    try:
        values = json.loads(text)
    except json.JSONDecodeError as e:
        return RowError(
            "malformed_json", f"{ref}: malformed JSON: {e.msg} at column {e.colno}", ref
        )
    if not isinstance(values, dict):
        kind = type(values).__name__
        return RowError("not_an_object", f"{ref}: expected a JSON object, got a {kind}", ref)
    return RawRow(values, ref)


import jobrunner.io.openai_batch  # noqa: E402,F401  (registers the openai-batch reader)
