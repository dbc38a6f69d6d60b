"""Line formats (JSON Lines, OpenAI batch files): one row per non-blank line.

A file is read from its start, or from a known line on up to a byte offset: a Ray block names
such a span (executors/ray_blocks.py), so a worker reads its own rows from the input instead of
receiving them pickled by the driver. Row and line numbers are the whole file's either way.
A compressed file is read as the text it holds (io/compressed.py): its offsets are the text's,
and it is only ever read from its start (a stream has nothing to seek by).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import NamedTuple

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
        if byte:  # a compressed file's stream refuses (io.UnsupportedOperation): never a span
            f.seek(byte)
        for raw in f:
            if stop is not None and byte >= stop:
                return
            here, byte = byte, byte + len(raw)
            if raw.strip():
                yield Line(here, byte, line, row, raw.removeprefix(BOM) if line == 1 else raw)
                row += 1
            line += 1


def read_lines(
    file: str, parse: ParseLine, start: tuple[int, int, int] = (0, 1, 0), stop: int | None = None
) -> Iterator[Item]:
    for ln in iter_lines(file, start, stop):
        yield parse(ln.raw, RowRef(file, ln.row, line=ln.line))
