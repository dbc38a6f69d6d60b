"""The input's identity is its content: each file by its place under the input root and a hash.

A file is named by its path relative to the input root (the directory `input.path` names, or
the folder of a single file, or a glob's fixed leading folders), so the same job resumes from
any working directory and after the input folder moves. Its content is a BLAKE2b hash of its
bytes, streamed in 4 MiB chunks; size and mtime are a pre-check only: when both match the
record, the recorded hash is trusted and the file is not read again.

Each row of the input also has a digest (`RowDigests`, kept in the run directory as
`input_rows.parquet`), so a changed file can be explained row by row: which ids changed,
disappeared or appeared.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobrunner.io.fs import file_stat, filesystem, is_object, is_remote, open_file

CHUNK = 1 << 22
ROWS_FILE = "input_rows.parquet"


def input_root(path: str) -> Path | str:
    """The folder input file names are relative to (on a store: its URL, without a slash)."""
    if is_remote(path):
        return _store_root(path)
    p = Path(path).expanduser()
    if p.is_file():
        return p.resolve().parent
    if p.is_dir():
        return p.resolve()
    fixed = []
    for part in Path(os.path.expanduser(path)).parts:
        if glob.has_magic(part):
            break
        fixed.append(part)
    return Path(*fixed).resolve() if fixed else Path.cwd()


def _store_root(url: str) -> str:
    scheme_, rest = url.split("://", 1)
    parts = rest.rstrip("/").split("/")
    fixed = next((i for i, part in enumerate(parts) if glob.has_magic(part)), None)
    if fixed is None:
        fs, p = filesystem(url)
        fixed = len(parts) - 1 if is_object(fs, p) else len(parts)
    return f"{scheme_}://{'/'.join(parts[:fixed])}"


def relative_name(file: str, root: Path | str) -> str:
    """`file` relative to `root` (POSIX separators); absolute when it lies outside."""
    if isinstance(root, str):  # a store URL: names are keys, nothing to resolve
        return file[len(root) + 1 :] if file.startswith(root + "/") else file
    full = Path(file).resolve()
    try:
        return full.relative_to(root).as_posix()
    except ValueError:
        return full.as_posix()


def file_digest(path: str) -> str:
    h = hashlib.blake2b(digest_size=16)
    with open_file(path) as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def file_records(files: list[str], root: Path | str, previous: list[dict] | None) -> list[dict]:
    """{path, size, mtime_ns, blake2b} per file; a file whose size and mtime match `previous`
    keeps its recorded hash unread. A store object's mtime is its last-modified time."""
    known = {r["path"]: r for r in previous or [] if isinstance(r, dict)}
    out = []
    for f in files:
        size, mtime_ns = file_stat(f)
        rec = {"path": relative_name(f, root), "size": size, "mtime_ns": mtime_ns}
        old = known.get(rec["path"])
        same_stat = (
            old and old.get("size") == rec["size"] and old.get("mtime_ns") == rec["mtime_ns"]
        )
        rec["blake2b"] = old["blake2b"] if same_stat and old.get("blake2b") else file_digest(f)
        out.append(rec)
    return out


def content_key(records: list[dict]) -> list[list[str]]:
    """What the fingerprint hashes: names and contents, not sizes or times."""
    return [[r["path"], r["blake2b"]] for r in records]


def is_legacy(records: Any) -> bool:
    """Manifests before content identity held [path relative to the cwd, size] pairs."""
    return isinstance(records, list) and any(isinstance(r, list) for r in records)


@dataclass
class FileChanges:
    """How the input differs from the one a run directory started with, file by file."""

    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    changed: list[tuple[str, int, int]] = field(default_factory=list)  # path, old, new size

    @property
    def paths(self) -> set[str]:
        return {*self.added, *self.removed, *(c[0] for c in self.changed)}

    def __bool__(self) -> bool:
        return bool(self.paths)

    def lines(self) -> list[str]:
        out = [f"{p}: a new input file" for p in self.added]
        out += [f"{p}: no longer in the input" for p in self.removed]
        for p, old, new in self.changed:
            how = f"size {old} -> {new} bytes" if old != new else f"same size ({new} bytes)"
            out.append(f"{p}: content changed ({how})")
        return out


def compare_files(old: list[dict], new: list[dict]) -> FileChanges:
    before = {r["path"]: r for r in old}
    now = {r["path"]: r for r in new}
    ch = FileChanges()
    ch.added = [p for p in now if p not in before]
    ch.removed = [p for p in before if p not in now]
    ch.changed = [
        (p, before[p]["size"], now[p]["size"])
        for p in now
        if p in before and before[p]["blake2b"] != now[p]["blake2b"]
    ]
    return ch


def legacy_changes(old: list, new: list[dict]) -> FileChanges:
    """Old records name files relative to some working directory: compare sizes in order."""
    sizes = [r[1] for r in old if isinstance(r, list) and len(r) == 2]
    if sizes == [r["size"] for r in new]:
        return FileChanges()
    ch = FileChanges()
    ch.changed = [(r["path"], s, r["size"]) for r, s in zip(new, sizes, strict=False)]
    ch.added = [r["path"] for r in new[len(sizes) :]]
    ch.removed = [f"(file {i + 1} of the earlier input)" for i in range(len(new), len(sizes))]
    if not ch:
        ch.changed = [(r["path"], r["size"], r["size"]) for r in new]
    return ch


def row_digest(values: dict[str, Any]) -> bytes:
    text = json.dumps(values, sort_keys=True, ensure_ascii=False, default=repr)
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest()


@dataclass
class RowDigests:
    """Per input file (by relative name): the id (null where the row has none) and digest of
    each row, in input order, as Arrow chunks (a few bytes a row, no Python object per row).

    In memory only for the files a resume compares; the whole input's digests (a first run)
    are streamed to disk by `RowDigestFile`."""

    files: dict[str, list[tuple[Any, Any]]] = field(default_factory=dict)  # name -> (ids, digests)

    def add_chunk(self, file: str, ids: Any, digests: Any) -> None:
        """`ids`: an Arrow string array; `digests`: an Arrow binary(8) array of equal length."""
        self.files.setdefault(file, []).append((ids, digests))

    def ids(self, names: Iterable[str]) -> dict[str, bytes]:
        """{id: digest} of the rows of `names` (only to explain a changed file)."""
        out: dict[str, bytes] = {}
        for n in names:
            for ids, digests in self.files.get(n, []):
                for i, d in zip(ids.to_pylist(), digests.to_pylist(), strict=True):
                    if i is not None:
                        out[i] = d
        return out

    def tables(self) -> Iterator[Any]:
        for name, chunks in self.files.items():
            for ids, digests in chunks:
                yield _digest_table(name, ids, digests)

    def save(self, path: Path, replacing: set[str]) -> None:
        """Write `path` atomically: its rows of files not in `replacing` (read a row group at a
        time), then these rows."""
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        with RowDigestFile(path) as out:
            if RowDigests.readable(path):
                for batch in pq.ParquetFile(path).iter_batches(batch_size=1 << 16):
                    files = batch.column("file").cast(_schema().field("file").type)
                    keep = pc.invert(pc.is_in(files, _strings(sorted(replacing))))
                    t = _digest_table(files, batch.column("id"), batch.column("digest"))
                    out.write(t.filter(keep))
            for t in self.tables():
                out.write(t)
            out.commit()

    @staticmethod
    def readable(path: Path) -> bool:
        import pyarrow.parquet as pq

        try:
            return path.is_file() and pq.read_metadata(path) is not None
        except Exception:  # damaged: treated as absent (rewritten by the next scan)
            return False

    @classmethod
    def load(cls, path: Path, names: Iterable[str]) -> RowDigests | None:
        """The rows of files `names`; None when the file is missing or unreadable (the run then
        cannot explain by row)."""
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        wanted = _strings(sorted(set(names)))
        out = cls()
        try:
            for batch in pq.ParquetFile(path).iter_batches(batch_size=1 << 16):
                files = batch.column("file").cast(_schema().field("file").type)
                t = _digest_table(files, batch.column("id"), batch.column("digest"))
                t = t.filter(pc.is_in(files, wanted))
                for name in pc.unique(t.column("file")).to_pylist():
                    rows = t.filter(pc.equal(t.column("file"), name))
                    ids, digests = rows.column("id"), rows.column("digest")
                    out.add_chunk(name, ids.combine_chunks(), digests.combine_chunks())
        except Exception:  # missing or damaged: the caller falls back to file-level answers
            return None
        return out


class RowDigestFile:
    """Row digests written to `path` as they come, visible (atomically) only on commit()."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
        self._writer: Any = None

    def add_chunk(self, file: str, ids: Any, digests: Any) -> None:
        self.write(_digest_table(file, ids, digests))

    def write(self, table: Any) -> None:
        import pyarrow.parquet as pq

        if self._writer is None:
            self._writer = pq.ParquetWriter(self.tmp, _schema())
        self._writer.write_table(table)

    def commit(self) -> None:
        from jobrunner.io.writers import fsync_file

        if self._writer is None:
            self.write(_schema().empty_table())
        self._writer.close()
        self._writer = None
        fsync_file(self.tmp)
        os.replace(self.tmp, self.path)

    def __enter__(self) -> RowDigestFile:
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._writer is not None:
            self._writer.close()
        self.tmp.unlink(missing_ok=True)


def _schema() -> Any:
    import pyarrow as pa

    return pa.schema([("file", pa.string()), ("id", pa.string()), ("digest", pa.binary(8))])


def _strings(values: list[str]) -> Any:
    import pyarrow as pa

    return pa.array(values, pa.string())


def _digest_table(file: Any, ids: Any, digests: Any) -> Any:
    """A table of the digest file's schema; `file` one name (str) or a column."""
    import pyarrow as pa

    if isinstance(file, str):
        file = pa.repeat(pa.scalar(file, pa.string()), len(ids))
    return pa.table([file, ids.cast(pa.string()), digests.cast(pa.binary(8))], schema=_schema())


def is_run_dir(d: Path) -> bool:
    """A jobrunner run directory: its lock names jobrunner, or it has a manifest and results/."""
    lock = d / ".lock"
    if lock.is_file():
        with open(lock, "rb") as f:
            if f.read(9) == b"jobrunner":
                return True
    return (d / "manifest.json").is_file() and (d / "results").is_dir()


def outside_run_dirs(files: list[str], root: Path) -> list[str]:
    """`files` without those inside a run directory under `root` (an output.path placed inside
    the input folder): a run never reads its own or another run's files as input rows."""
    verdict: dict[Path, bool] = {}

    def inside(f: str) -> bool:
        for d in Path(f).resolve().parents:
            if d not in verdict:
                verdict[d] = is_run_dir(d)
            if verdict[d]:
                return True
            if d == root:
                return False
        return False

    return [f for f in files if not inside(f)]


# A store run directory's commit records (io/store_rundir.py): `<run>/commits/NNNNNNNNNN.json`.
_STORE_RECORD = re.compile(r"^(.+)/commits/\d{10}\.json$")
# An object named as a run directory's are (rundir.OWN_FILES, OWN_FOLDER_FILES; a store run's
# errors/ and commits/): only such objects of a glob have their folders checked for records.
RUN_FOLDERS = ("results", "rows", "telemetry", "ray-errors", "errors", "commits")
RUN_OBJECT = re.compile(
    rf"/({'|'.join(RUN_FOLDERS)})/[^/]+$"
    r"|/(errors\.jsonl|manifest\.json|input_rows\.parquet|report\.\w+|metrics\.prom"
    r"|output\.jsonl|batch\.json|estimate\.json|_SUCCESS)$"
)


def outside_store_runs(files: list[str], root: str, complete: bool) -> list[str]:
    """`files` (store URLs) without those inside a store run directory under `root` (a prefix
    holding commit records): an output.path inside the input prefix is never read back as
    input rows. `complete`: `files` is every object under `root` (a prefix's listing), so the
    records are among them; otherwise (a glob) each folder from a file named as a run's
    objects are (RUN_OBJECT) up to `root` is listed once: a partitioned corpus's files cost no
    listing."""
    verdict = {m[1]: True for f in files if (m := _STORE_RECORD.match(f))}

    def inside(f: str) -> bool:
        if not complete and not RUN_OBJECT.search(f):
            return False  # not named as a run's objects are: no folder of it is listed
        d = f.rstrip("/").rsplit("/", 1)[0]
        while len(d) >= len(root):
            if d not in verdict:
                verdict[d] = not complete and _holds_records(d)
            if verdict[d]:
                return True
            d = d.rsplit("/", 1)[0]
        return False

    return [f for f in files if not inside(f)]


def _holds_records(prefix: str) -> bool:
    fs, p = filesystem(prefix)
    try:
        return any(_STORE_RECORD.match(k) for k in fs.ls(f"{p}/commits", detail=False))
    except FileNotFoundError:
        return False
