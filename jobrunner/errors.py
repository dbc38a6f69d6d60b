"""User-facing errors, one exit code each (DESIGN.md, "Exit codes")."""

from __future__ import annotations

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
