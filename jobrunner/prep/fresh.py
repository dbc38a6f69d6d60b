"""The input rows a resumed run still has to do, without a Python object for the others.

Parquet rows already committed are dropped by their id column, vectorized, before any row
becomes a dict (a resume with 50M rows committed reads ids, not rows), and a row group the
committed row ranges cover whole (io/row_ranges.py) is not read at all. Other formats go through
their reader; the prep stream checks every row against the committed set anyway.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from jobrunner.config import JobConfig
from jobrunner.formats import file_partitions, input_files, job_rows, resolve_format
from jobrunner.formats.parquet import open_parquet, raw_rows
from jobrunner.io.identity import input_root
from jobrunner.io.ids import IdSet, batch_ids, hash_ids
from jobrunner.io.partitions import with_partitions
from jobrunner.io.readers import Item
from jobrunner.io.row_ranges import CommittedRows
from jobrunner.prep.prepare import derived_name
from jobrunner.types import RowRef


class FreshRows:
    """Iterates the job's input items minus committed Parquet rows; counts those in `skipped`."""

    def __init__(
        self, cfg: JobConfig, done: IdSet | set[str], rows: CommittedRows | None = None
    ) -> None:
        """`rows`: the committed row ranges (io/row_ranges.py); a row group they cover whole
        is skipped without reading its ids."""
        self.cfg = cfg
        self.done = done
        self.rows = rows or CommittedRows()
        self.skipped = 0
        self._root = input_root(cfg.input.path)

    def __iter__(self) -> Iterator[Item]:
        c = self.cfg.input
        if (
            not isinstance(self.done, IdSet)
            or not self.done
            or (resolve_format(c.path, c.format) != "parquet")
        ):
            yield from job_rows(c)
            return
        for file in input_files(c.path, c.format):
            yield from self._parquet(file)

    def _parquet(self, file: str) -> Iterator[Item]:
        """A row group at a time: its id column decides which rows are left, and only a group
        with rows left is read whole (a resume past 50M committed rows reads ids, not rows)."""
        pf = open_parquet(file)
        col, name, first = self.cfg.input.id_column, derived_name(file, self._root), 0
        columns = [col] if col and col in pf.schema_arrow.names else []
        values = file_partitions(file, self.cfg.input, "parquet")
        for group in range(pf.metadata.num_row_groups):
            size = pf.metadata.row_group(group).num_rows
            if self.rows.covers(file, first, first + size):  # committed whole: no id read
                self.skipped += size
                first += size
                continue
            ids = batch_ids(pf.read_row_group(group, columns=columns), name, first, col, values)
            keep = np.flatnonzero(~self._done(ids))
            self.skipped += len(ids) - len(keep)
            if len(keep):
                yield from with_partitions(self._rows(pf, file, group, first, keep), values)
            first += len(ids)

    def _done(self, ids) -> np.ndarray:
        import pyarrow.compute as pc

        known = pc.is_valid(ids).to_numpy(zero_copy_only=False)
        done = np.zeros(len(ids), bool)
        if known.any():
            done[known] = self.done.contains_hashes(hash_ids(pc.drop_null(ids)))
        return done

    def _rows(self, pf, file: str, group: int, first: int, keep: np.ndarray) -> Iterator[Item]:
        """Rows `keep` (offsets in the group, sorted) of row group `group`, which starts at
        row `first` of the file."""
        start = 0
        for batch in pf.iter_batches(batch_size=self.cfg.input.batch_rows, row_groups=[group]):
            lo, hi = np.searchsorted(keep, [start, start + batch.num_rows])
            rows = keep[lo:hi] - start
            if len(rows):
                refs = [RowRef(file, first + start + int(row)) for row in rows]
                yield from raw_rows(batch.take(rows), refs)
            start += batch.num_rows
