"""JSON Lines: one object per line, in and out. A bad line is a RowError; its neighbours are read."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from jobrunner.errors import InputDataError
from jobrunner.formats.base import Format
from jobrunner.formats.columns import infer_schema, json_dumps
from jobrunner.formats.lines import iter_lines
from jobrunner.io.compressed import plain_name
from jobrunner.io.readers import Item, RawRow, ReadOptions
from jobrunner.types import RowError, RowRef, kind_of


def read_jsonl(file: str, batch_rows: int, options: ReadOptions = ReadOptions()) -> Iterator[Item]:
    for ln in iter_lines(file):
        if ln.row == 0 and ln.raw.lstrip()[:1] == b"[":
            _refuse_an_array(file, ln.raw)
        yield parse_json_line(ln.raw, RowRef(file, ln.row, line=ln.line))


def _refuse_an_array(file: str, first: bytes) -> None:
    """A `.json` file is often one JSON array of rows, not JSON Lines: every line of it would
    be a malformed row. Refused as a whole (65) when its first line opens an array that goes
    on (it does not parse alone) or is a whole array of objects; an array that is one bad row
    among rows stays that row's error."""
    try:
        value = json.loads(first)
    except (ValueError, RecursionError):
        value = None
    if value is not None and not (
        isinstance(value, list) and all(isinstance(v, dict) for v in value)
    ):
        return
    name = Path(file).name
    raise InputDataError(
        f"{file}: holds a JSON array, not JSON Lines (one object a line): convert it, e.g."
        f" `jq -c '.[]' {name} > {Path(plain_name(name)).stem}.jsonl`, and run again"
    )


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
            "malformed_json", f"{ref}: malformed JSON at column {e.pos + 1}: {e.msg}", ref
        )
    except RecursionError:
        return RowError("too_complex", f"{ref}: the JSON value is nested too deeply", ref)
    if b"\\u" in raw and not _is_text(values):
        return RowError(
            "invalid_unicode",
            f"{ref}: the line holds a lone UTF-16 surrogate (a \\uD800-\\uDFFF escape without"
            " its pair), which is not text",
            ref,
        )
    if not isinstance(values, dict):
        return RowError(
            "not_an_object", f"{ref}: expected a JSON object, got {kind_of(values)}", ref
        )
    return RawRow(values, ref)


def _is_text(values: Any) -> bool:
    """Whether every string in `values` is valid Unicode (encodes to UTF-8)."""
    try:
        json.dumps(values, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return False
    except (ValueError, RecursionError):
        return True  # not ours to judge here (NaN, depth): later steps name it
    return True


def write_jsonl(records: list[dict[str, Any]], path: Path) -> None:
    """One strict JSON object a line: NaN and +-Infinity as null, bytes as base64 text
    (formats/columns.json_dumps)."""
    with open(path, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json_dumps(r) + "\n")


def file_schema(file: str, options: ReadOptions = ReadOptions()) -> Any:
    """The Arrow types of a JSONL file's keys, over all its lines (bad lines left out)."""
    return infer_schema(r.values for r in read_jsonl(file, 0) if isinstance(r, RawRow))


FORMAT = Format(
    "jsonl",
    suffixes=(".jsonl", ".ndjson", ".json"),
    read=read_jsonl,
    parse_line=parse_json_line,
    compressed=True,
    write=write_jsonl,
    suffix=".jsonl",
    schema=file_schema,
    schema_of_rows=True,
)
