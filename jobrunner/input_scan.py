"""The pass over the input before the first token: rows, duplicate ids, every id, row digests.

No Python object per row survives a batch: ids are kept as 64-bit hashes (io.ids.IdSet),
duplicates are found by sorting the hashes, and only ids whose hashes meet are read again, by
value, with their places (so a hash collision never fails a job). Parquet and CSV inputs of the
column preparer are read vectorized: the id column alone (io.ids.batch_ids, the rules of
Preparer.row_id) and, for row digests of Parquet files, each row's values hashed by polars.
Other inputs (JSONL, OpenAI batch files, a preparer with its own ids) go through their reader
and preparer a row at a time, their hashes and digests collected a chunk at a time.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from jobrunner.config import InputConfig, JobConfig
from jobrunner.formats import (
    detect_format,
    file_partitions,
    input_files,
    input_format,
    make_preparer,
    read_file,
)
from jobrunner.formats.columns import SchemaInference
from jobrunner.io.identity import RowDigests, input_root, relative_name, row_digest
from jobrunner.io.ids import IdSet, batch_ids, hash_ids, iter_id_batches, repeated
from jobrunner.io.partitions import Values, add_partitions
from jobrunner.io.readers import RawRow
from jobrunner.prep.prepare import Preparer, derived_name, place_name
from jobrunner.types import RowRef

CHUNK_ROWS = 1 << 16  # rows per hashing chunk on the row-at-a-time path
DIGEST_SEED = 0x726F7773  # polars hash_rows seed for Parquet row digests (identity.RowDigests)
FAST_FORMATS = ("parquet", "csv")


@dataclass
class Scan:
    total: int = 0
    duplicates: dict[str, list[str]] = field(default_factory=dict)
    ids: IdSet = field(default_factory=IdSet)  # every row's id, and the ids row errors name
    rows: RowDigests = field(default_factory=RowDigests)  # for the files asked for
    # file -> its rows' Arrow schema, typed as they were read (`schemas`: Format.schema_of_rows)
    schemas: dict[str, Any] = field(default_factory=dict)


@dataclass
class Piece:
    """A batch of one file's rows: `hashes` of its valid ids; `ids` (null where invalid) and
    `digests` only when the file's row digests were asked for."""

    rows: int
    hashes: np.ndarray
    ids: Any = None
    digests: Any = None


def scan_input(
    cfg: JobConfig,
    digest_files: set[str],
    count: bool = True,
    rows: Any = None,
    stop: Any = None,
    expect_rows: int = 0,
    schemas: bool = False,
) -> Scan:
    """One pass over the input (only the files in `digest_files` when not `count`). The digests
    go to `rows` when given (an identity.RowDigestFile), else to the Scan's RowDigests. Once
    `stop` (a threading.Event) is set, it returns what it has read so far. `expect_rows` (the
    footers' count) sizes the hash array at once: 8 bytes a row, not chunks and their copy.
    `schemas`: the files of a format typed over its rows (JSONL) are typed as they are read,
    into `Scan.schemas` (the run's schema then needs no second read: run_schema.decide)."""
    scan, hashes = Scan(), _Hashes(expect_rows)
    sink = rows if rows is not None else scan.rows
    for file, name, pieces, typing in _files(
        cfg, None if count else digest_files, digest_files, schemas
    ):
        for piece in pieces:
            if stop is not None and stop.is_set():
                return scan
            scan.total += piece.rows
            hashes.add(piece.hashes)
            if piece.digests is not None:
                sink.add_chunk(name, piece.ids, piece.digests)
        if typing is not None:
            scan.schemas[file] = typing.schema()
    hashes = hashes.array()
    suspects = repeated(hashes)  # sorts `hashes` in place, so IdSet's sort below is cheap
    scan.ids = IdSet(hashes)
    if len(suspects):
        scan.duplicates = _places(cfg, suspects)
    return scan


class _Hashes:
    """Id hashes as they come: into one array of the expected size, chunks past it."""

    def __init__(self, expect: int) -> None:
        self.buf, self.n, self.chunks = np.empty(expect, np.uint64), 0, []

    def add(self, h: np.ndarray) -> None:
        if self.n + len(h) <= len(self.buf):
            self.buf[self.n : self.n + len(h)] = h
            self.n += len(h)
        else:
            self.chunks.append(h)

    def array(self) -> np.ndarray:
        head = self.buf[: self.n]
        return np.concatenate([head, *self.chunks]) if self.chunks else head


def metadata_rows(cfg: JobConfig) -> int | None:
    """The input's row count from its Parquet footers, when every file is Parquet read by the
    column preparer (the rows the scan would count); None otherwise."""
    from jobrunner.formats.parquet import open_parquet

    preparer = make_preparer(cfg, tokenizer=None)
    files = input_files(cfg.input.path, cfg.input.format)
    if not all(_vectorized(preparer, detect_format(f, cfg.input.format)) for f in files):
        return None
    if any(detect_format(f, cfg.input.format) != "parquet" for f in files):
        return None
    return sum(open_parquet(f).metadata.num_rows for f in files)


def scan_ids(cfg: JobConfig) -> tuple[int, dict[str, list[str]]]:
    """Count rows and find duplicate ids with where each occurs, reading ids only."""
    scan = scan_input(cfg, set())
    return scan.total, scan.duplicates


def _files(
    cfg: JobConfig, only: set[str] | None, digest_files: set[str], schemas: bool
) -> Iterator[tuple[str, str, Iterator[Piece], SchemaInference | None]]:
    """(file, its name, its pieces, the inference typing its rows as they are read or None)."""
    root = input_root(cfg.input.path)
    preparer = make_preparer(cfg, tokenizer=None)
    for file in input_files(cfg.input.path, cfg.input.format):
        name = relative_name(file, root)
        if only is not None and name not in only:
            continue
        fmt = detect_format(file, cfg.input.format)
        digests, values = name in digest_files, file_partitions(file, cfg.input, fmt)
        if _vectorized(preparer, fmt) and not (digests and fmt != "parquet"):
            pieces = _fast(cfg, file, fmt, derived_name(file, root), digests, values)
            yield file, name, pieces, None
        else:
            typing = SchemaInference() if schemas and input_format(fmt).schema_of_rows else None
            pieces = _by_row(preparer, file, fmt, cfg.input, digests, typing, values)
            yield file, name, pieces, typing


def _vectorized(preparer: Any, fmt: str) -> bool:
    """The column preparer's ids are the id column's values (or `file:row`): batch_ids."""
    kind = type(preparer)
    return (
        fmt in FAST_FORMATS
        and kind.row_id is Preparer.row_id
        and kind.result_ids is Preparer.result_ids
    )


def _fast(
    cfg: JobConfig, file: str, fmt: str, name: str, digests: bool, values: Values
) -> Iterator[Piece]:
    """`values`: the file's partition columns, where the id column may be (batch_ids); row
    digests are of the file's own values (its folders are in its name already)."""
    col = cfg.input.id_column
    if digests:  # fmt is parquet: whole rows, for their digests
        from jobrunner.formats.parquet import read_parquet_batches

        first, batches = 0, read_parquet_batches(file, max(cfg.input.batch_rows, CHUNK_ROWS))
        for batch in batches:
            ids = batch_ids(batch, name, first, col, values)
            yield Piece(batch.num_rows, _valid_hashes(ids), ids, _batch_digests(batch))
            first += batch.num_rows
        return
    for first, batch in iter_id_batches(file, fmt, col, cfg.input.read_options):
        yield Piece(batch.num_rows, _valid_hashes(batch_ids(batch, name, first, col, values)))


def _by_row(
    preparer: Any,
    file: str,
    fmt: str,
    inp: InputConfig,
    digests: bool,
    typing: SchemaInference | None = None,
    partitions: Values | None = None,
) -> Iterator[Piece]:
    """The reader's items a row at a time; hashes and digests kept a chunk at a time. Digests
    as they always were: per id an item ends as, of its values (or of its error's message).
    `typing` takes each row's values (as the format's `schema` reads them: its RawRows). `inp`:
    the job's input settings. Ids are of the rows with their `partitions` columns; typing and
    digests of the file's own values (run_schema adds the partition columns; the file's name
    holds its folders)."""
    rows, ids, digest_ids, digest_values = 0, [], [], []
    for read in input_format(fmt).read(file, inp.batch_rows, inp.read_options):
        if typing is not None and isinstance(read, RawRow):
            typing.add(read.values)
        item = add_partitions(read, partitions or {})
        row_id = preparer.row_id(item) if isinstance(item, RawRow) else item
        if isinstance(row_id, str):
            ended = preparer.result_ids(row_id, item)
            ids += ended
            values = read.values
        else:  # the row's error (bad id, unreadable row): it may still name the row
            ended = [None]
            if getattr(row_id, "id", None) is not None:
                ids.append(str(row_id.id))
            values = {"error": row_id.message}
        rows += len(ended)
        if digests and getattr(row_id, "source", True) is not None:
            digest = row_digest(values)
            digest_ids += ended
            digest_values += [digest] * len(ended)
        if len(ids) >= CHUNK_ROWS or len(digest_ids) >= CHUNK_ROWS:
            yield _piece(rows, ids, digest_ids, digest_values, digests)
            rows, ids, digest_ids, digest_values = 0, [], [], []
    if rows:
        yield _piece(rows, ids, digest_ids, digest_values, digests)


def _piece(rows: int, ids: list[str], row_ids: list, row_digests: list, digests: bool) -> Piece:
    import pyarrow as pa

    h = hash_ids(ids) if ids else np.empty(0, np.uint64)
    if not digests:
        return Piece(rows, h)
    return Piece(rows, h, pa.array(row_ids, pa.string()), pa.array(row_digests, pa.binary(8)))


def _valid_hashes(ids: Any) -> np.ndarray:
    import pyarrow.compute as pc

    if ids.null_count:
        ids = pc.drop_null(ids)
    return hash_ids(ids) if len(ids) else np.empty(0, np.uint64)


def _batch_digests(batch: Any) -> Any:
    """8 bytes a row over all its values (polars hash_rows); row_digest where polars cannot
    take the batch's types."""
    import pyarrow as pa

    try:
        import polars as pl

        h = pl.from_arrow(batch).hash_rows(seed=DIGEST_SEED).to_numpy()
        return pa.FixedSizeBinaryArray.from_buffers(
            pa.binary(8), len(h), [None, pa.py_buffer(np.ascontiguousarray(h).tobytes())]
        )
    except Exception:  # polars lacks a type of this batch (e.g. an empty struct)
        return pa.array([row_digest(v) for v in _batch_values(batch)], pa.binary(8))


def _batch_values(batch: Any) -> Iterator[dict[str, Any]]:
    """Each row's values; a row that does not convert, as its error (as the reader has it)."""
    try:
        yield from batch.to_pylist()
        return
    except Exception:
        pass
    for i in range(batch.num_rows):
        try:
            yield batch.slice(i, 1).to_pylist()[0]
        except Exception as e:
            yield {"error": f"a value does not convert: {e}"}


def _places(cfg: JobConfig, suspects: np.ndarray) -> dict[str, list[str]]:
    """Where each id whose hash occurs twice is, by value: {id: [place, ...]} of real repeats,
    in input order; a place names its file relative to the input root (prepare.place_name)."""
    places: dict[str, list[str]] = {}
    root = input_root(cfg.input.path)
    preparer = make_preparer(cfg, tokenizer=None)
    for file in input_files(cfg.input.path, cfg.input.format):
        fmt, name = detect_format(file, cfg.input.format), place_name(file, root)
        values = file_partitions(file, cfg.input, fmt)
        if _vectorized(preparer, fmt) and fmt == "parquet":  # CSV: the reader has the lines
            # a Parquet file is never compressed: its derived ids name it as its places do
            found = _fast_places(cfg, file, fmt, name, suspects, values)
        else:
            found = _row_places(preparer, read_file(file, cfg.input, kind=fmt), name, suspects)
        for row_id, place in found:
            places.setdefault(row_id, []).append(place)
    return {k: v for k, v in places.items() if len(v) > 1}


def _fast_places(cfg, file: str, fmt: str, name: str, suspects: np.ndarray, values: Values):
    import pyarrow.compute as pc

    for first, batch in iter_id_batches(file, fmt, cfg.input.id_column, cfg.input.read_options):
        ids = batch_ids(batch, name, first, cfg.input.id_column, values)
        valid = np.flatnonzero(pc.is_valid(ids).to_numpy(zero_copy_only=False))
        if not len(valid):
            continue
        hits = valid[np.isin(hash_ids(ids.take(valid)), suspects)]
        for k in hits:
            yield ids[int(k)].as_py(), str(RowRef(name, first + int(k)))


def _row_places(preparer, items, name: str, suspects: np.ndarray):
    chunk: list[tuple[str, str]] = []
    for item in items:
        row_id = preparer.row_id(item) if isinstance(item, RawRow) else None
        if isinstance(row_id, str):
            place = str(replace(item.source, file=name))
            chunk += [(rid, place) for rid in preparer.result_ids(row_id, item)]
        if len(chunk) >= CHUNK_ROWS:
            yield from _hits(chunk, suspects)
            chunk = []
    yield from _hits(chunk, suspects)


def _hits(chunk: list[tuple[str, str]], suspects: np.ndarray):
    if chunk:
        hits = np.isin(hash_ids([rid for rid, _ in chunk]), suspects)
        yield from (c for c, hit in zip(chunk, hits, strict=True) if hit)
