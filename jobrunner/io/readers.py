"""What readers yield, and where a job's input files are (a file, a directory or a glob).

A reader (one per format, formats/) yields `RawRow`s (the row's values and where it came from)
or `RowError`s for rows that cannot even be parsed (malformed JSON, invalid UTF-8, a line that
is not an object); the lines around a bad one are still read. Nothing is held beyond one batch.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jobrunner.errors import InputDataError
from jobrunner.io.identity import input_root, outside_run_dirs
from jobrunner.types import RowError, RowRef


@dataclass
class RawRow:
    values: dict[str, Any]
    source: RowRef


Item = RawRow | RowError


def find_files(path: str, suffixes: Collection[str]) -> list[str]:
    """The files at `path` in a stable order: a file, the files of a directory with one of
    `suffixes`, or the files a glob matches."""
    p = Path(path).expanduser()
    if p.is_file():
        return [str(p)]
    if p.is_dir():
        files = sorted(str(f) for f in p.rglob("*") if f.is_file() and f.suffix in suffixes)
    else:
        files = sorted(
            f for f in glob.glob(os.path.expanduser(path), recursive=True) if os.path.isfile(f)
        )
    files = outside_run_dirs(files, input_root(path))
    if not files:
        raise InputDataError(f"input.path: no input files found at {path!r}")
    return files
