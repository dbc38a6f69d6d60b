"""User-facing errors, one exit code each (DESIGN.md, "Exit codes")."""

from __future__ import annotations

import errno

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_DATA = 65
EXIT_INTERNAL = 70
EXIT_INTERRUPTED = 75
EXIT_CONFIG = 78


class JobError(Exception):
    """Base: a failure the user can act on. `exit_code` is what the CLI returns."""

    exit_code = EXIT_INTERNAL


class ConfigError(JobError):
    """Bad job configuration (file, key, value) or a model that cannot be resolved."""

    exit_code = EXIT_CONFIG


class InputDataError(JobError):
    """Bad input data for the job as a whole (no files, duplicate ids, error rate exceeded)."""

    exit_code = EXIT_DATA


class Interrupted(JobError):
    """SIGTERM/SIGINT or preemption: finished rows are committed; rerun to continue."""

    exit_code = EXIT_INTERRUPTED


class ResumeMismatch(ConfigError):
    """The run directory holds a different job; use --restart to start over."""


class RunLocked(JobError):
    """Another process is running this run directory."""

    exit_code = EXIT_CONFIG


class RunInProgress(JobError):
    """`jobrunner report` on a run directory another process is running: try again later."""

    exit_code = EXIT_INTERRUPTED


class RunDirError(ConfigError):
    """The run directory cannot be used as it is (not a run's, damaged); says what to do."""


class DiskFull(JobError):
    """No space left where the run writes: committed rows are kept; free space and rerun."""

    exit_code = EXIT_INTERRUPTED


class OutOfResources(JobError):
    """A limit of the machine was reached (file size, open files) or its storage failed:
    committed rows are kept; fix it and run the same command again."""

    exit_code = EXIT_INTERRUPTED


_NO_SPACE = {errno.ENOSPC, errno.EDQUOT}
_NO_WRITE = {errno.EACCES, errno.EPERM, errno.EROFS}
# Limits and failures of the machine (75): the same command succeeds once they are lifted.
_LIMITS = {
    errno.EFBIG: "the file grew past the largest size this process or file system allows"
    " (`ulimit -f`, or the file system's own limit): raise the limit or put output.path on"
    " another file system",
    errno.EMFILE: "too many open files for this process: raise the limit (`ulimit -n`)",
    errno.ENFILE: "too many open files on this machine: close some programs",
    errno.EIO: "input/output error (the disk or network file system failed): check the device",
}
# Paths that cannot be as given (78): the user changes the path.
_BAD_PATH = {
    errno.ENAMETOOLONG: "a name in the path is too long: choose a shorter path",
    errno.EISDIR: "is a directory where a file is expected: give a file's path",
    errno.ENOTDIR: "a part of the path is a file where a folder is expected: fix the path",
    errno.ELOOP: "too many levels of symbolic links: fix the links or give another path",
}
_AGAIN = "run the same command again (committed rows are kept)"


def from_os_error(e: BaseException) -> JobError | None:
    """The user-facing error for an OSError the environment caused (a full disk, a file-size
    limit, a path we may not write), wherever it was raised; None for any other error (a bug:
    exit 70)."""
    if not isinstance(e, OSError):
        return None
    code = e.errno or _errno_in_text(str(e))
    where = e.filename or _path_in_text(str(e)) or "the run directory"
    if code in _NO_SPACE:
        return DiskFull(
            f"no space left on the device writing {where}: free some space and {_AGAIN}"
        )
    if code in _LIMITS:
        return OutOfResources(f"{where}: {_LIMITS[code]}, then {_AGAIN}")
    if code in _NO_WRITE:
        why = "read-only file system" if code == errno.EROFS else "permission denied"
        return ConfigError(
            f"cannot write {where} ({why}): make it writable or choose another path"
            " (output.path, or $JOBRUNNER_CACHE for the model cache)"
        )
    if code in _BAD_PATH:
        return ConfigError(f"{where}: {_BAD_PATH[code]}")
    return None


def _errno_in_text(text: str) -> int | None:
    """pyarrow raises OSError without errno; its message reads `... [errno 28] ...`."""
    import re

    m = re.search(r"errno (\d+)", text, re.IGNORECASE)
    if m:
        return int(m[1])
    for code, words in (
        (errno.ENOSPC, "No space left"),
        (errno.EROFS, "Read-only file system"),
        (errno.EFBIG, "File too large"),
    ):
        if words in text:
            return code
    return None


def _path_in_text(text: str) -> str | None:
    import re

    m = re.search(r"'(/[^']+)'", text)
    return m[1] if m else None


class StoreError(JobError):
    """A write to the object store failed: committed rows are kept; rerun to continue."""

    exit_code = EXIT_INTERRUPTED
