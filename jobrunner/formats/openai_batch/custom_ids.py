"""The custom_ids of a batch input: where each was first used, and the error of a line that
uses one again (a per-line error, never a job failure)."""

from __future__ import annotations

from collections.abc import Iterable

from jobrunner.formats.openai_batch.read import BatchLineError
from jobrunner.prep.prepare import derived_id
from jobrunner.types import RowRef

LINE_BITS = 40  # a first line is one int: its file's index above these bits, its line below


class FirstLines:
    """Each id used so far (a custom_id, an embeddings line's `<custom_id>#<index>`) and the
    line that first used it, kept as one int beside the id: its file named relative to the
    input root (prepare.place_name), and its line."""

    def __init__(self) -> None:
        self._lines: dict[str, int] = {}
        self._files: dict[str, int] = {}  # file name -> its index

    def __contains__(self, row_id: str) -> bool:
        return row_id in self._lines

    def add(self, ids: Iterable[str], file: str, line: int) -> None:
        index = self._files.setdefault(file, len(self._files))
        for row_id in ids:
            self._lines.setdefault(row_id, index << LINE_BITS | line)

    def where(self, row_id: str) -> str:
        """`2024/a.jsonl:line 7`, as a RowRef names a line."""
        first = self._lines[row_id]
        files = list(self._files)  # only on a repeat: an error, never the common path
        return str(RowRef(files[first >> LINE_BITS], 0, first & ((1 << LINE_BITS) - 1)))


def duplicate_line(raw, cid: str, why: str) -> BatchLineError:
    """A line whose id another line already uses: its error, under the line's derived id."""
    return BatchLineError(
        "duplicate_custom_id",
        f"{raw.source}: {why}",
        raw.source,
        derived_id(raw.source),
        "custom_id",
        custom_id=cid,
    )
