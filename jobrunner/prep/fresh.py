"""The input rows a resumed run still has to do, without a Python object for the others.

Parquet rows already committed are dropped by their id column, vectorized, before any row
becomes a dict (a resume with 50M rows committed reads ids, not rows). Other formats go through
their reader; the prep stream checks every row against the committed set anyway.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from jobrunner.config import JobConfig
from jobrunner.formats import input_files, read_rows, resolve_format
from jobrunner.formats.parquet import read_parquet_batches
from jobrunner.io.identity import input_root
from jobrunner.io.ids import IdSet, batch_ids, hash_ids
from jobrunner.io.readers import Item, RawRow
from jobrunner.prep.prepare import derived_name
from jobrunner.types import RowRef


class FreshRows:
    """Iterates the job's input items minus committed Parquet rows; counts those in `skipped`."""

    def __init__(self, cfg: JobConfig, done: IdSet | set[str]) -> None:
        self.cfg = cfg
        self.done = done
        self.skipped = 0

    def __iter__(self) -> Iterator[Item]:
        c = self.cfg.input
        if (
            not isinstance(self.done, IdSet)
            or not self.done
            or (resolve_format(c.path, c.format) != "parquet")
        ):
            yield from read_rows(c.path, c.format, c.batch_rows)
            return
        for file in input_files(c.path):
            yield from self._parquet(file)

    def _parquet(self, file: str) -> Iterator[Item]:
        import pyarrow.compute as pc

        first, name = 0, derived_name(file, input_root(self.cfg.input.path))
        for batch in read_parquet_batches(file, self.cfg.input.batch_rows):
            ids = batch_ids(batch, name, first, self.cfg.input.id_column)
            known = pc.is_valid(ids).to_numpy(zero_copy_only=False)
            done = np.zeros(batch.num_rows, bool)
            if known.any():
                done[known] = self.done.contains_hashes(hash_ids(pc.drop_null(ids)))
            keep = np.flatnonzero(~done)
            self.skipped += batch.num_rows - len(keep)
            if len(keep):
                for row, values in zip(keep, batch.take(keep).to_pylist(), strict=True):
                    yield RawRow(values, RowRef(file, first + int(row)))
            first += batch.num_rows
