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
from jobrunner.io.fs import glob_files, is_remote, local_path
from jobrunner.io.identity import input_root, outside_run_dirs
from jobrunner.types import RowError, RowRef

log = logging.getLogger(__name__)

MAX_SKIPPED_NAMED = 5  # files a directory's skipped-files warning names
_NOTED: set[tuple[str, int]] = set()  # (directory, files skipped) already warned of


@dataclass
class RawRow:
    values: dict[str, Any]
    source: RowRef
    # Values the row's result keeps in place of `values`' where their Python form drops
    # digits (formats/parquet.py: a time64[ns] column's Arrow scalars); None: none.
    exact: dict[str, Any] | None = None


Item = RawRow | RowError


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
        named = glob.has_magic(path) or _suffix(path) in suffixes
        found = [f for f in glob_files(path) if named or _suffix(f) in suffixes]
        if not found:
            raise InputDataError(f"input.path: no input files found at {path!r}")
        return found
    p = Path(path).expanduser()
    if p.is_file():
        return [str(p)]
    if p.is_dir():
        every = walk_files(p)
        files = [f for f in every if _suffix(f) in suffixes]
        if not quiet:
            _note_skipped(path, [f for f in every if _suffix(f) not in suffixes])
    elif "**" in path:
        files = _recursive_glob(os.path.expanduser(path))
    else:
        files = [f for f in glob.glob(os.path.expanduser(path)) if os.path.isfile(f)]
    files = outside_run_dirs(_once_each(sorted(files)), input_root(path))
    if not files:
        raise InputDataError(f"input.path: no input files found at {path!r}")
    return files


def _suffix(file: str) -> str:
    return full_suffix(file)  # data.JSONL is JSONL, data.JSONL.GZ is .jsonl.gz


def _note_skipped(path: str, skipped: list[str]) -> None:
    """A directory's files of no input format are not read: say which, never silently."""
    skipped = outside_run_dirs(sorted(skipped), input_root(path))
    if not skipped or (path, len(skipped)) in _NOTED:  # input_files runs several times a run
        return
    _NOTED.add((path, len(skipped)))
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
