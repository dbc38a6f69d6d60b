"""Which input rows each committed shard holds: `rows/<shard name>`, row ranges per input file.

A resume skips a Parquet row group whose every row a committed shard holds without reading the
group's ids (prep/fresh.py); only groups partly committed are read and checked by id. The
ranges are a subset of the committed rows, never more: a shard's file is written after the
shard is visible and removed before a shard of its name is published again, only the files of
shards present count, and --retry-errors (which rewrites shards) and --restart remove them all.
A shard without one (a commit killed in between, a Ray worker's, an older run's) leaves its rows
to the id check, as before. Error rows are not in them: their groups are read by id.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

ROWS_DIR = "rows"


def ranges_table(sources: list[Any]) -> Any | None:
    """The rows `sources` (RowRefs) name, as a table of (file, start, stop) runs; None when a
    row has no source."""
    import pyarrow as pa

    if not sources or any(s is None for s in sources):
        return None
    files, starts, stops = [], [], []
    by_file: dict[str, list[int]] = {}
    for s in sources:
        by_file.setdefault(s.file, []).append(s.row)
    for file, rows in by_file.items():
        start, stop = runs(np.unique(np.asarray(rows, np.int64)))
        files += [file] * len(start)
        starts.append(start)
        stops.append(stop)
    return pa.table(
        {
            "file": pa.array(files, pa.string()).dictionary_encode(),
            "start": np.concatenate(starts),
            "stop": np.concatenate(stops),
        }
    )


def runs(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted unique rows as [start, stop) runs of consecutive rows."""
    if not len(rows):
        return rows, rows
    breaks = np.flatnonzero(np.diff(rows) != 1) + 1
    return rows[np.r_[0, breaks]], rows[np.r_[breaks - 1, len(rows) - 1]] + 1


def forget(run_path: Path, shard_name: str) -> None:
    """Before a shard of this name is published: an older file of its name never counts."""
    (run_path / ROWS_DIR / shard_name).unlink(missing_ok=True)


def record(run_path: Path, shard_name: str, sources: list[Any]) -> None:
    """Write the shard's row ranges (after the shard is visible; atomic)."""
    import pyarrow.parquet as pq

    from jobrunner.io.writers import write_atomic

    table = ranges_table(sources)
    if table is None:
        return
    (run_path / ROWS_DIR).mkdir(exist_ok=True)
    write_atomic(table, run_path / ROWS_DIR / shard_name, lambda t, p: pq.write_table(t, p))


def forget_all(run_path: Path) -> None:
    """--retry-errors rewrites shards: no range may outlive them."""
    shutil.rmtree(run_path / ROWS_DIR, ignore_errors=True)


class CommittedRows:
    """The committed row ranges of each input file, merged: `covers(file, start, stop)`."""

    def __init__(self, ranges: dict[str, tuple[np.ndarray, np.ndarray]] | None = None) -> None:
        self.ranges = ranges or {}

    @classmethod
    def read(cls, run_path: Path, shard_names: Iterable[str]) -> CommittedRows:
        import pyarrow.parquet as pq

        folder = run_path / ROWS_DIR
        parts: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
        for name in shard_names:
            if not (folder / name).is_file():
                continue
            table = pq.read_table(folder / name).combine_chunks()
            if not table.num_rows:
                continue
            files = table.column("file").chunk(0)  # dictionary-encoded: few files a shard
            codes = files.indices.to_numpy(zero_copy_only=False)
            start, stop = table.column("start").to_numpy(), table.column("stop").to_numpy()
            for k, file in enumerate(files.dictionary.to_pylist()):
                mask = codes == k
                parts.setdefault(file, []).append((start[mask], stop[mask]))
        return cls(
            {
                file: merged(
                    np.concatenate([a for a, _ in got]), np.concatenate([b for _, b in got])
                )
                for file, got in parts.items()
            }
        )

    def __bool__(self) -> bool:
        return bool(self.ranges)

    def covers(self, file: str, start: int, stop: int) -> bool:
        """Whether every row of [start, stop) of `file` is committed."""
        found = self.ranges.get(file)
        if found is None:
            return False
        starts, stops = found
        i = int(np.searchsorted(starts, start, "right")) - 1
        return i >= 0 and stops[i] >= stop


def merged(starts: np.ndarray, stops: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Ranges joined where they touch or overlap: disjoint, sorted by start."""
    order = np.argsort(starts, kind="stable")
    starts, stops = starts[order], np.maximum.accumulate(stops[order])
    new = np.r_[True, starts[1:] > stops[:-1]]
    last = np.r_[np.flatnonzero(new)[1:] - 1, len(starts) - 1]
    return starts[new], stops[last]
