"""What readers yield, and where a job's input files are (a file, a directory or a glob).

A reader (one per format, formats/) yields `RawRow`s (the row's values and where it came from)
or `RowError`s for rows that cannot even be parsed (malformed JSON, invalid UTF-8, a line that
is not an object); the lines around a bad one are still read. Nothing is held beyond one batch.
"""

from __future__ import annotations

import fnmatch
import glob
import logging
import os
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jobrunner.errors import InputDataError
from jobrunner.io.compressed import COMPRESSED, full_suffix
from jobrunner.io.fs import bucket_word, glob_files, is_remote, local_path, missing_bucket
from jobrunner.io.identity import input_root, outside_run_dirs, outside_store_runs
from jobrunner.types import RowError, RowRef

log = logging.getLogger(__name__)

MAX_SKIPPED_NAMED = 5  # files a directory's skipped-files warning names
_NOTED: set[tuple[str, str, int]] = set()  # (what, input path, files skipped) warned of


@dataclass
class RawRow:
    values: dict[str, Any]
    source: RowRef
    # Values the row's result keeps in place of `values`' where their Python form drops
    # digits (formats/parquet.py: a time64[ns] column's Arrow scalars); None: none.
    exact: dict[str, Any] | None = None


Item = RawRow | RowError


@dataclass(frozen=True)
class ReadOptions:
    """The job's settings that decide how a file is cut into rows (`input.*`); a format's
    reader takes those that apply to it."""

    # CSV: the separator of every CSV file; None: `.tsv` and `.tab` by tab, else told from the
    # file's header (io/csv_rows.file_delimiter)
    delimiter: str | None = None


def find_files(path: str, suffixes: Collection[str], quiet: bool = False) -> list[str]:
    """The files at `path` in a stable order: a file, the files of a directory with one of
    `suffixes` (compound for compressed files: `.jsonl.gz`), or the files a glob matches.
    Symlinked folders are followed, each folder once (a symlink loop ends there); a file
    reached twice (a link, overlapping matches) is read once; files inside a run directory
    are left out (`identity.outside_run_dirs`). On a store (io.fs): the object, the objects
    under a prefix with one of `suffixes`, or the objects a glob matches. `quiet`: a look
    that is not the input's listing names no skipped file."""
    path = local_path(path)
    if is_remote(path):
        return _store_files(path, suffixes, quiet)
    p = Path(path).expanduser()
    if p.is_file():
        return [str(p)]
    if p.is_dir():
        every = _data_files(str(p), walk_files(p), suffixes, quiet)
        files = [f for f in every if _suffix(f) in suffixes]
        if not quiet:
            skipped = [f for f in every if _suffix(f) not in suffixes]
            _note_skipped(path, outside_run_dirs(sorted(skipped), input_root(path)))
    elif "**" in path:
        files = _recursive_glob(os.path.expanduser(path))
    else:
        files = [f for f in glob.glob(os.path.expanduser(path)) if os.path.isfile(f)]
    if not p.is_dir():
        files = _data_files(os.path.expanduser(path), files, suffixes, quiet)
    files = outside_run_dirs(_once_each(sorted(files)), input_root(path))
    if not files:
        raise InputDataError(f"input.path: no input files found at {path!r}")
    return files


def _store_files(path: str, suffixes: Collection[str], quiet: bool) -> list[str]:
    """find_files on a store: the object, a glob's objects, or a prefix's objects of a known
    format (directory markers and others named in a warning), outside any run directory."""
    magic = glob.has_magic(path)
    try:
        listed = glob_files(path)
    except FileNotFoundError:  # the bucket does not exist (a glob's listing finds nothing)
        listed = []
    if not listed:
        raise InputDataError(f"input.path: no input files found at {path!r}{_no_bucket(path)}")
    every = outside_store_runs(listed, str(input_root(path)), complete=not magic)
    every = _data_files(path, every, suffixes, quiet)
    # the path is the object itself, or a glob: its objects are read whatever their suffix
    # ("" is among `suffixes` when the job names its format: Hive's 000000_0 under a prefix)
    named = magic or listed == [path] or (_suffix(path) != "" and _suffix(path) in suffixes)
    found = [f for f in every if (named or _suffix(f) in suffixes) and not f.endswith("/")]
    if not quiet and not named:  # a directory marker (a key ending in /) is no file
        others = [f for f in every if _suffix(f) not in suffixes and not f.endswith("/")]
        _note_skipped(path, others)
    if not found:
        raise InputDataError(f"input.path: no input files found at {path!r}")
    return found


def _data_files(path: str, files: list[str], suffixes: Collection[str], quiet: bool) -> list[str]:
    """`files` less those under a name starting with `.` or `_` below the input root that
    `path` does not spell out: Spark's `_temporary/` (an unfinished or failed write),
    `_SUCCESS`, `.crc` checksums, `_metadata`: Spark, Hive, pyarrow and Dask leave them out of
    a dataset, so reading them would read rows twice. A Hive partition folder (`_c=1`) is data.
    Input files left out are named in a warning (the markers are not)."""
    root, spelled = fixed_root(path), path.split("/")
    kept, hidden = [], []
    for f in files:
        below = parts_below(f, root)
        (hidden if any(_hidden(n) and not _spelled(n, spelled) for n in below) else kept).append(f)
    inputs = [f for f in hidden if _suffix(f) in suffixes]
    if inputs and not quiet:
        _note_hidden(path, inputs)
    return kept


def fixed_root(path: str) -> str:
    """The input root as `path` spells it: its part before any wildcard."""
    parts = path.rstrip("/").split("/")
    fixed = next((i for i, part in enumerate(parts) if glob.has_magic(part)), len(parts))
    return "/".join(parts[:fixed])


def parts_below(file: str, root: str) -> list[str]:
    """The names of `file`'s path below `root` (none where it is not below it). A store's
    listing may name its scheme otherwise than the path does (`s3a://` listed as `s3://`)."""
    if not is_remote(file):
        file, root = os.path.normpath(file), os.path.normpath(root or ".")
    else:
        file, root = file.split("://", 1)[-1], root.split("://", 1)[-1]
    root = root.rstrip("/")
    if root == ".":
        return file.split("/")
    return file[len(root) + 1 :].split("/") if file.startswith(root + "/") else []


def _hidden(name: str) -> bool:
    return name.startswith(".") or (name.startswith("_") and "=" not in name)


def _spelled(name: str, parts: list[str]) -> bool:
    """Whether input.path names it (`data/_staging/**`) or such names (`.cache*`, `_*`)."""
    return any(p == name or (glob.has_magic(p) and p.startswith(name[0])) for p in parts)


def _note_hidden(path: str, hidden: list[str]) -> None:
    if _noted("hidden", path, hidden):
        return
    root = fixed_root(path)
    names = ", ".join("/".join(parts_below(f, root)) or f for f in hidden[:MAX_SKIPPED_NAMED])
    more = f" and {len(hidden) - MAX_SKIPPED_NAMED} more" if len(hidden) > MAX_SKIPPED_NAMED else ""
    log.warning(
        "input.path %s: %d files under a name starting with '.' or '_' are not read (%s%s):"
        " a writer's temporary or bookkeeping files (Spark's _temporary/), as Spark, Hive and"
        " pyarrow read a folder; name such a file or folder in input.path to read it",
        path,
        len(hidden),
        names,
        more,
    )


def _noted(what: str, path: str, files: list[str]) -> bool:
    """Whether this warning was given already; notes it."""
    key = (what, path, len(files))
    seen = key in _NOTED
    _NOTED.add(key)
    return seen


def _no_bucket(path: str) -> str:
    """`: bucket B does not exist` (container on Azure) where it does not, else nothing."""
    bucket = missing_bucket(path)
    return f": {bucket_word(path)} {bucket} does not exist" if bucket else ""


def _suffix(file: str) -> str:
    return full_suffix(file)  # data.JSONL is JSONL, data.JSONL.GZ is .jsonl.gz


def _note_skipped(path: str, skipped: list[str]) -> None:
    """A directory's files of no input format are not read: say which, never silently."""
    if not skipped or _noted("format", path, skipped):  # input_files runs several times a run
        return
    packed = sorted({_suffix(f) for f in skipped if Path(f).suffix.lower() in COMPRESSED})
    names = ", ".join(os.path.relpath(f, path) for f in skipped[:MAX_SKIPPED_NAMED])
    more = (
        f" and {len(skipped) - MAX_SKIPPED_NAMED} more" if len(skipped) > MAX_SKIPPED_NAMED else ""
    )
    why = (
        f"; compressed as input.path does not read ({', '.join(packed)}): decompress them"
        if packed
        else ""
    )
    if any(not _suffix(f) for f in skipped):
        why += "; files without a suffix (Hive's 000000_0) are read when input.format names one"
    log.warning(
        "input.path %s: %d files of no input format are not read (%s%s)%s",
        path,
        len(skipped),
        names,
        more,
        why,
    )


def walk_files(root: Path) -> list[str]:
    """Every file under `root`, following symlinked folders but entering each folder once."""
    seen: set[tuple[int, int]] = set()
    out = []
    for here, dirs, names in os.walk(root, followlinks=True):
        st = os.stat(here)
        if (st.st_dev, st.st_ino) in seen:
            dirs[:] = []
            continue
        seen.add((st.st_dev, st.st_ino))
        dirs.sort()
        out += [
            os.path.join(here, n) for n in sorted(names) if os.path.isfile(os.path.join(here, n))
        ]
    return out


def _recursive_glob(pattern: str) -> list[str]:
    """A `**` glob over `walk_files` (loop-safe), with glob's rules for each path segment."""
    parts = Path(pattern).parts
    fixed = next((i for i, part in enumerate(parts) if glob.has_magic(part)), len(parts))
    root = Path(*parts[:fixed]) if fixed else Path(".")
    if not root.is_dir():
        return []
    rest = parts[fixed:]
    return [f for f in walk_files(root) if _match(rest, Path(f).relative_to(root).parts)]


def _match(pattern: tuple[str, ...], parts: tuple[str, ...]) -> bool:
    if not pattern:
        return not parts
    head = pattern[0]
    if head == "**":
        return _match(pattern[1:], parts) or (
            bool(parts) and not parts[0].startswith(".") and _match(pattern, parts[1:])
        )
    if not parts or (parts[0].startswith(".") and not head.startswith(".")):
        return False
    return fnmatch.fnmatchcase(parts[0], head) and _match(pattern[1:], parts[1:])


def _once_each(files: list[str]) -> list[str]:
    seen: set[tuple[int, int]] = set()
    out = []
    for f in files:
        st = os.stat(f)
        if (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            out.append(f)
    return out
