"""The run lock: one run at a time in a run directory, and `jobrunner report` only between runs.

A run holds an flock on `<run dir>/.lock` for its whole life; the kernel drops it when the
process dies (even by kill -9), so a crashed run never blocks the next one. `report` rewrites
files inside the run directory, so it takes the same lock without waiting and holds it while
it writes: a run in progress is refused (RunInProgress, 75) and never written into. So that a
run starting meanwhile is not refused in turn, a report takes `.report.lock` first and lets it
go last; a run that finds `.lock` taken waits while `.report.lock` is held (a report: seconds)
and is refused (RunLocked, 78) only by another run. Both locks are flocks, both files stay.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from jobrunner.errors import RunInProgress, RunLocked

log = logging.getLogger(__name__)

LOCK, REPORT_LOCK = ".lock", ".report.lock"
POLL_SECONDS = 0.05  # how often a starting run looks again while a report writes


@contextlib.contextmanager
def run_lock(path: Path) -> Iterator[None]:
    """Held for a run's life: RunLocked (78) while another run holds the directory; a report
    writing there is waited for."""
    with open(path / LOCK, "a+") as f:
        waited = False
        while not _take(f):
            if not _reporting(path):
                if _take(f):  # the report ended between the two looks
                    break
                raise RunLocked(
                    f"{path} is being run by {_holder(f)} (lock {path / LOCK}); wait for it to"
                    " finish or stop it: a stopped or killed run releases the lock, and a rerun"
                    " continues"
                )
            if not waited:
                log.info("%s: waiting for `jobrunner report` to finish writing", path)
                waited = True
            time.sleep(POLL_SECONDS)
        _write_holder(f, "jobrunner")
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@contextlib.contextmanager
def run_lock_where_writable(path: Path) -> Iterator[None]:
    """run_lock, but a directory this process may not write (a read-only mount, another
    user's results) is read without it: no run of ours can be writing there either, and
    whatever the caller then fails to write fails as it would have."""
    try:
        open(path / LOCK, "a+").close()
    except OSError as e:
        if e.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise
        yield
        return
    with run_lock(path):
        yield


@contextlib.contextmanager
def report_lock(path: Path, where: str, so_far: str = "") -> Iterator[None]:
    """Held while `report` writes into the run directory at `path` (`where` names it to the
    user): RunInProgress (75, with `so_far`, what is committed) while a run holds it."""
    path.mkdir(parents=True, exist_ok=True)  # a store run's staging directory, on this machine
    with open(path / REPORT_LOCK, "a+") as r, open(path / LOCK, "a+") as f:
        fcntl.flock(r, fcntl.LOCK_EX)  # another report's turn ends within seconds
        _write_holder(r, "jobrunner report")
        if not _take(f):
            raise RunInProgress(
                f"{where}: a run is in progress ({_holder(f)} holds its lock{so_far and ', '}"
                f"{so_far}); its reports are written as it ends. Try again when it ends"
            )
        try:
            yield
        finally:
            fcntl.flock(
                f, fcntl.LOCK_UN
            )  # before .report.lock: a waiting run then finds .lock free


def _take(f: IO[str]) -> bool:
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _reporting(path: Path) -> bool:
    """A report holds `.report.lock` (taken before `.lock`, let go after it)."""
    with open(path / REPORT_LOCK, "a+") as r:
        try:
            fcntl.flock(r, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        return False  # closing the file lets the shared lock go


def _holder(f: IO[str]) -> str:
    f.seek(0)
    return f.read().strip() or "another process"


def _write_holder(f: IO[str], what: str) -> None:
    """Who holds the lock, for the message of whoever finds it taken."""
    f.seek(0)
    f.truncate()
    f.write(f"{what} pid {os.getpid()} on {socket.gethostname()}")
    f.flush()
