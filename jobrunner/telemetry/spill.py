"""An append-only log of telemetry records in bounded memory.

A 100M-row job makes 100M row records and tens of millions of engine steps; kept as dicts they
would take more memory than the model. `SpillLog` keeps at most `chunk` records in memory and
writes each full chunk to a Parquet part file in a private temporary folder (removed when the log
is closed or collected). It reads like the list it replaces: `len`, indexing and slicing (the
recent end is served from memory), iteration, and `tables()` for a streaming copy into a
timeline file.
"""

from __future__ import annotations

import shutil
import tempfile
import weakref
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

CHUNK = 65_536  # records held in memory before they go to a part file

STRING_COLUMNS = ("device", "worker")


def arrow_schema(columns: list[str]) -> Any:
    """Every timeline column is float64 except the names (device, worker)."""
    import pyarrow as pa

    return pa.schema([(c, pa.string() if c in STRING_COLUMNS else pa.float64()) for c in columns])


def to_table(records: list[dict[str, Any]], columns: list[str]) -> Any:
    """Records as a table of `columns`, built column by column (a missing key is null)."""
    import pyarrow as pa

    schema = arrow_schema(columns)
    arrays = [
        pa.array([rec.get(f.name) for rec in records], type=f.type, from_pandas=True)
        for f in schema
    ]
    return pa.Table.from_arrays(arrays, schema=schema)


class SpillLog:
    def __init__(self, columns: list[str], chunk: int = CHUNK) -> None:
        self.columns = list(columns)
        self.chunk = chunk
        self.mem: list[dict[str, Any]] = []
        self.parts: list[tuple[Path, int]] = []  # (part file, records in it)
        self.spilled = 0
        self._dir: Path | None = None
        self._cleanup: weakref.finalize | None = None

    # ---------------------------------------------------------------- writing

    def append(self, record: dict[str, Any]) -> None:
        self.mem.append(record)
        if len(self.mem) >= self.chunk:
            self._spill()

    def extend(self, records: Iterable[dict[str, Any]]) -> None:
        for r in records:
            self.append(r)

    def __iadd__(self, records: Iterable[dict[str, Any]]) -> SpillLog:
        self.extend(records)
        return self

    def _spill(self) -> None:
        import pyarrow.parquet as pq

        if self._dir is None:
            self._dir = Path(tempfile.mkdtemp(prefix="jobrunner-telemetry-"))
            self._cleanup = weakref.finalize(self, shutil.rmtree, self._dir, True)
        path = self._dir / f"part-{len(self.parts):05d}.parquet"
        pq.write_table(to_table(self.mem, self.columns), path)
        self.parts.append((path, len(self.mem)))
        self.spilled += len(self.mem)
        self.mem = []

    def close(self) -> None:
        """Drop the part files (the log is empty afterwards)."""
        if self._cleanup is not None:
            self._cleanup()
        self.mem, self.parts, self.spilled, self._dir = [], [], 0, None

    # ---------------------------------------------------------------- reading

    def __len__(self) -> int:
        return self.spilled + len(self.mem)

    def __bool__(self) -> bool:
        return len(self) > 0

    def __iter__(self) -> Iterator[dict[str, Any]]:
        import pyarrow.parquet as pq

        for path, _ in self.parts:
            yield from pq.read_table(path).to_pylist()
        yield from list(self.mem)

    def __getitem__(self, key: int | slice) -> Any:
        n = len(self)
        if isinstance(key, int):
            i = key + n if key < 0 else key
            if not 0 <= i < n:
                raise IndexError("SpillLog index out of range")
            if i >= self.spilled:
                return self.mem[i - self.spilled]
            return next(self._from(i))
        start, stop, step = key.indices(n)
        if step != 1:
            raise ValueError("SpillLog slices take no step")
        if start >= self.spilled:  # the recent end: from memory
            return self.mem[start - self.spilled : stop - self.spilled]
        out = []
        for i, rec in enumerate(self._from(start), start):
            if i >= stop:
                break
            out.append(rec)
        return out

    def _from(self, start: int) -> Iterator[dict[str, Any]]:
        import pyarrow.parquet as pq

        first = 0
        for path, count in self.parts:
            if first + count > start:
                yield from pq.read_table(path).slice(max(start - first, 0)).to_pylist()
            first += count
        yield from self.mem[max(start - self.spilled, 0) :]

    def tables(self) -> Iterator[Any]:
        """The records as Arrow tables of `columns`, part by part (a streaming copy)."""
        import pyarrow.parquet as pq

        schema = arrow_schema(self.columns)
        for path, _ in self.parts:
            yield pq.read_table(path).cast(schema)
        if self.mem:
            yield to_table(self.mem, self.columns)
