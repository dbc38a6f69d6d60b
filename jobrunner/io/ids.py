"""Row ids in compact form: 8 bytes an id, never a Python object per row.

`IdSet` holds sorted unique 64-bit hashes of ids (a numpy array); membership is a binary
search, asked a batch of ids at a time. Ids are hashed vectorized (polars' string hash with a
fixed seed); the hashes live only in this process, so their stability across polars versions
does not matter. The duplicate check rereads colliding candidates by value, so a collision never
fails a job; a pending row whose hash meets a committed one would be skipped as done, with
probability committed * pending / 2^64 (below 1.4e-4 for 100M rows in all).

`batch_ids` gives the job's id of every row of an Arrow batch, with the rules of
`prep.prepare.Preparer.row_id` (the id column as text, else `file:row`; null where invalid).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from jobrunner.io.readers import ReadOptions

SORTED_LOOKUP = 1024  # queries from which contains_hashes sorts them first
LOOKUP_CHUNK = 1 << 20  # queries contains_hashes answers at once
CSV_ID_ROWS = 1 << 16  # ids of parsed CSV rows per batch
SEED = 0x6A6F6272  # fixed: the same id hashes alike in every batch of this process
_TEXT_OR_INT = ("string", "large_string", "string_view", "int8", "int16", "int32", "int64")
_TEXT_OR_INT += ("uint8", "uint16", "uint32", "uint64")


def hash_ids(ids: Any) -> np.ndarray:
    """uint64 hashes of ids: a pyarrow array/chunked array or a sequence of str (no nulls)."""
    import polars as pl

    s = pl.from_arrow(ids) if hasattr(ids, "type") else pl.Series(list(ids), dtype=pl.String)
    if isinstance(s, pl.DataFrame):  # pragma: no cover - a table passed by mistake
        raise TypeError("hash_ids takes one column")
    return s.cast(pl.String).hash(seed=SEED).to_numpy()


class IdSet:
    """A set of row ids as sorted unique uint64 hashes (module doc)."""

    def __init__(self, hashes: np.ndarray | None = None) -> None:
        self.hashes = _sorted_unique(hashes) if hashes is not None else np.empty(0, np.uint64)

    @classmethod
    def from_chunks(cls, chunks: Iterable[np.ndarray]) -> IdSet:
        parts = [np.asarray(c, np.uint64) for c in chunks]
        return cls(np.concatenate(parts) if parts else None)

    @classmethod
    def of(cls, ids: Iterable[str]) -> IdSet:
        ids = list(ids)
        return cls(hash_ids(ids) if ids else None)

    def __len__(self) -> int:
        return len(self.hashes)

    def __bool__(self) -> bool:
        return len(self.hashes) > 0

    def __eq__(self, other: object) -> bool:
        """Equal to another IdSet or to a set of ids holding the same ids."""
        if isinstance(other, (set, frozenset)):
            other = IdSet.of(other)
        if not isinstance(other, IdSet):
            return NotImplemented
        return np.array_equal(self.hashes, other.hashes)

    __hash__ = None  # type: ignore[assignment]  (mutable-like: compares by content)

    def __contains__(self, row_id: str) -> bool:
        return bool(self.contains_hashes(hash_ids([row_id]))[0])

    def contains(self, ids: Sequence[str]) -> np.ndarray:
        """A bool per id."""
        if not len(self.hashes) or not len(ids):
            return np.zeros(len(ids), bool)
        return self.contains_hashes(hash_ids(ids))

    def contains_hashes(self, h: np.ndarray) -> np.ndarray:
        if not len(self.hashes):
            return np.zeros(len(h), bool)
        if len(h) > LOOKUP_CHUNK:  # bounded scratch memory for a query of every id
            parts = range(0, len(h), LOOKUP_CHUNK)
            return np.concatenate([self.contains_hashes(h[i : i + LOOKUP_CHUNK]) for i in parts])
        if len(h) < SORTED_LOOKUP or bool(np.all(h[1:] >= h[:-1])):
            return self._found(h)
        # Sorted queries walk the array in order: several times faster than random probes
        # when the set is far larger than the cache (a resume past 50M committed ids).
        order = np.argsort(h)
        out = np.empty(len(h), bool)
        out[order] = self._found(h[order])
        return out

    def _found(self, h: np.ndarray) -> np.ndarray:
        at = np.searchsorted(self.hashes, h)
        at[at == len(self.hashes)] = 0
        return self.hashes[at] == h

    def union(self, other: IdSet) -> IdSet:
        return IdSet(np.concatenate([self.hashes, other.hashes]))


def _sorted_unique(h: np.ndarray) -> np.ndarray:
    """Sorted unique values, sorting `h` in place (np.unique would hold two more copies)."""
    h = np.asarray(h, np.uint64)
    if not h.flags.writeable:
        h = h.copy()
    h.sort()
    if len(h) < 2:
        return h
    keep = np.empty(len(h), bool)
    keep[0] = True
    np.not_equal(h[1:], h[:-1], out=keep[1:])
    return h if keep.all() else h[keep]


def repeated(hashes: np.ndarray) -> np.ndarray:
    """The hashes that occur more than once (sorted, unique). Sorts `hashes` in place."""
    hashes.sort()
    return np.unique(hashes[1:][hashes[1:] == hashes[:-1]])


def batch_ids(
    batch: Any,
    name: str,
    first_row: int,
    id_column: str | None,
    partitions: dict[str, str | None] | None = None,
) -> Any:
    """The id of each row of an Arrow batch, as a string array; null where the row's id is
    invalid (null, empty, or of a type other than text or integer). Without an id column,
    `<name>:<row>`, `name` being the file as derived ids name it (prepare.derived_name). An
    id column the file lacks may be one of its partition keys (`partitions`, io/partitions.py):
    every row's id is then its folder's value."""
    import pyarrow as pa
    import pyarrow.compute as pc

    names = batch.schema.names
    if id_column and id_column not in names and id_column in (partitions or {}):
        value = pa.scalar(partitions[id_column], pa.string())
        batch = batch.append_column(id_column, pa.repeat(value, batch.num_rows))
        names = batch.schema.names
    if not id_column or id_column not in names:
        rows = pa.array(np.arange(first_row, first_row + batch.num_rows))
        return pc.binary_join_element_wise(name, pc.cast(rows, pa.string()), ":")
    col = batch.column(names.index(id_column))
    if pa.types.is_dictionary(col.type):  # pandas' Categorical: the ids are its values
        col = col.dictionary_decode()
    if isinstance(col.type, pa.UuidType):
        return uuid_text(col)
    if col.type in (pa.binary(), pa.large_binary(), pa.binary_view()):
        col = binary_text(col)
    if str(col.type) not in _TEXT_OR_INT:
        return pa.nulls(batch.num_rows, pa.string())
    text = pc.cast(col, pa.string())
    if pa.types.is_integer(col.type):
        return text
    blank = pc.equal(pc.utf8_trim_whitespace(text), "")
    return pc.if_else(blank, pa.scalar(None, pa.string()), text)


_HEX = np.array([f"{i:02x}".encode() for i in range(256)], "S2")
_DASHES = (8, 12, 16, 20)  # where the canonical form puts its dashes, in hex digits


def uuid_text(col: Any) -> Any:
    """A UUID column (Parquet's UUID type, as DuckDB and Iceberg write ids) as the canonical
    text str(uuid.UUID) gives, `1b4e28ba-2fa1-11d2-883f-0016d3cca427`, vectorized."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(col, pa.ChunkedArray):  # a table's column (a row group read whole)
        col = col.combine_chunks()
    storage = col.storage
    start = storage.offset * 16
    raw = np.frombuffer(storage.buffers()[1], np.uint8)[start : start + len(col) * 16]
    digits = _HEX[raw.reshape(-1, 16)].view(np.uint8).reshape(-1, 32)
    dash = np.full((len(col), 1), ord("-"), np.uint8)
    parts = [x for part in np.split(digits, _DASHES, axis=1) for x in (part, dash)][:-1]
    text = np.ascontiguousarray(np.hstack(parts)).view("S36").ravel()
    ids = pa.array(text, pa.binary(36)).cast(pa.string())
    return pc.if_else(col.is_null(), pa.scalar(None, pa.string()), ids)


def binary_text(col: Any) -> Any:
    """A binary column (Hive's and Impala's strings) as text; null where a value is not UTF-8
    (the preparer fails that row: invalid_utf8)."""
    import pyarrow as pa

    try:
        return col.cast(pa.string())
    except pa.ArrowInvalid:  # some value is not UTF-8: row by row
        return pa.array([_utf8(v) for v in col.to_pylist()], pa.string())


def _utf8(v: bytes | None) -> str | None:
    try:
        return None if v is None else v.decode("utf-8")
    except UnicodeDecodeError:
        return None


def valid_hashes(ids: Any) -> np.ndarray:
    """Hashes of the non-null ids of a string array (batch_ids' output)."""
    import pyarrow.compute as pc

    if ids.null_count:
        ids = pc.drop_null(ids)
    return hash_ids(ids) if len(ids) else np.empty(0, np.uint64)


def iter_id_batches(
    file: str, fmt: str, id_column: str | None, options: ReadOptions = ReadOptions()
) -> Any:
    """(first row, Arrow batch) over a Parquet or CSV file, reading the id column alone."""
    from jobrunner.io.fs import open_file

    if fmt == "parquet":
        import pyarrow.parquet as pq

        with open_file(file) as f:
            pf = pq.ParquetFile(f)
            has = bool(id_column) and id_column in pf.schema_arrow.names
            first = 0
            for batch in pf.iter_batches(batch_size=1 << 16, columns=[id_column] if has else []):
                yield first, batch
                first += batch.num_rows
        return
    yield from _csv_id_batches(file, id_column, options.delimiter)


def _csv_id_batches(file: str, id_column: str | None, delimiter: str | None) -> Any:
    """The CSV file's rows as io.csv_rows cuts them, the id column alone; a row the reader
    makes a RowError has a null id. Without an id column, batches of no columns."""
    from jobrunner.io.csv_rows import Block, CsvRows

    reader, first, ids = CsvRows(file, delimiter), 0, []
    k: int | None = None  # the id column's index (-1: none), once the header is read
    for part in reader.parts([id_column] if id_column else []):
        if ids and (isinstance(part, Block) or len(ids) == CSV_ID_ROWS):
            yield first, _ids_batch(ids, id_column if k != -1 else None)
            first, ids = first + len(ids), []
        if isinstance(part, Block):
            for batch in part.table.to_batches():
                yield first, batch
                first += batch.num_rows
            continue
        if k is None:
            k = reader.header.index(id_column) if id_column in reader.header else -1
        ids.append(part.fields[k] if k != -1 and part.problem is None else None)
    if ids:
        yield first, _ids_batch(ids, id_column if k != -1 else None)


def _ids_batch(ids: list[str | None], id_column: str | None) -> Any:
    """A batch of the id column, or (no id column: derived ids) of no column, as many rows."""
    import pyarrow as pa

    if id_column is None:
        return pa.record_batch({"": pa.nulls(len(ids))}).select([])
    return pa.record_batch({id_column: pa.array(ids, pa.string())})


def committed(done: IdSet | set[str], ids: Sequence[str | None]) -> list[bool]:
    """For each id, whether it is in `done` (None: never)."""
    if not done:
        return [False] * len(ids)
    if not isinstance(done, IdSet):
        return [i is not None and i in done for i in ids]
    known = [k for k, i in enumerate(ids) if i is not None]
    out = [False] * len(ids)
    hits = done.contains([ids[k] for k in known])
    for k, hit in zip(known, hits, strict=True):
        out[k] = bool(hit)
    return out
