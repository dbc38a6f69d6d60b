"""Executors run a whole job: `local` (this process, the default) or `ray` (Ray Data).

Looked up by name; each is a function `(JobConfig, RunOptions) -> JobSummary`.
"""

from __future__ import annotations

import importlib

from jobrunner.errors import ConfigError

EXECUTORS = {"local": "jobrunner.executors.local:run", "ray": "jobrunner.executors.ray:run"}


def run_with_executor(cfg, opts):
    target = EXECUTORS.get(cfg.executor)
    if target is None:
        raise ConfigError(f"executor: must be one of {sorted(EXECUTORS)}, got {cfg.executor!r}")
    module, _, name = target.partition(":")
    try:
        fn = getattr(importlib.import_module(module), name)
    except ImportError as e:
        raise ConfigError(
            f"executor {cfg.executor!r} is not available: {e}"
            " (for ray: pip install 'jobrunner[ray]')"
        ) from e
    return fn(cfg, opts)
