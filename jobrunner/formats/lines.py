"""Line formats (JSON Lines, OpenAI batch files): one row per non-blank line.

A file is read from its start, or from a known line on up to a byte offset: a Ray block names
such a span (executors/ray_blocks.py), so a worker reads its own rows from the input instead of
receiving them pickled by the driver. Row and line numbers are the whole file's either way.
A compressed file is read as the text it holds (io/compressed.py): its offsets are the text's,
and a stream has nothing to seek by, so a span of one starts from the file's start and skips the
text before the span (decompressing it: cheap beside parsing it, and never parsed).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import NamedTuple

from jobrunner.errors import InputDataError
from jobrunner.io.compressed import open_input
from jobrunner.io.readers import Item
from jobrunner.types import RowRef

BOM = b"\xef\xbb\xbf"  # Windows tools (and Azure's samples) start a file with one

ParseLine = Callable[[bytes, RowRef], Item]  # one line's bytes -> its RawRow or RowError


class Line(NamedTuple):
    byte: int  # offset of the line's first byte in the file's text (decompressed)
    end: int  # offset just past the line (its newline included)
    line: int  # 1-based line number
    row: int  # 0-based row index: blank lines are not rows
    raw: bytes  # the line, a UTF-8 BOM on line 1 removed


def iter_lines(file: str, start: tuple[int, int, int] = (0, 1, 0), stop: int | None = None):
    """The non-blank lines of `file` from `start` = (byte, line, row) of a line, up to the line
    that begins at or after byte `stop` (None: the end)."""
    byte, line, row = start
    with open_input(file) as f:
        if byte:
            _skip_to(f, byte, file)
        for raw in f:
            if stop is not None and byte >= stop:
                return
            here, byte = byte, byte + len(raw)
            if raw.strip():
                yield Line(here, byte, line, row, raw.removeprefix(BOM) if line == 1 else raw)
                row += 1
            line += 1


SKIP_BYTES = 1 << 20  # text a compressed stream is read past at once


def _skip_to(f, byte: int, file: str) -> None:
    """Put `f` at text offset `byte`: a seek, or for a compressed stream, reading past the
    text before it. A stream that ends first was changed since its spans were cut (65)."""
    if f.seekable():
        f.seek(byte)
        return
    left = byte
    while left and (got := len(f.read(min(left, SKIP_BYTES)))):
        left -= got
    if left:
        raise InputDataError(
            f"{file}: its text ends before offset {byte}, where a block of it starts: the file"
            " changed while the run read it. Run again"
        )


def read_lines(
    file: str, parse: ParseLine, start: tuple[int, int, int] = (0, 1, 0), stop: int | None = None
) -> Iterator[Item]:
    for ln in iter_lines(file, start, stop):
        yield parse(ln.raw, RowRef(file, ln.row, line=ln.line))
