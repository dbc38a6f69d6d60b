"""Executors run a whole job: `local` (this process, the default) or `ray` (Ray Data).

Looked up by name; each is a function `(JobConfig, RunOptions) -> JobSummary`. Both are
registered lazily, so that listing them does not import ray.
"""

from __future__ import annotations

from jobrunner.errors import ConfigError
from jobrunner.registry import Registry

EXECUTORS: Registry = Registry("executor")
EXECUTORS.register_lazy("local", "jobrunner.executors.local:run")
EXECUTORS.register_lazy("ray", "jobrunner.executors.ray:run")


def run_with_executor(cfg, opts):
    try:
        fn = EXECUTORS.get(cfg.executor)
    except ImportError as e:
        raise ConfigError(
            f"executor {cfg.executor!r} is not available: {e}"
            " (for ray: pip install 'jobrunner[ray]')"
        ) from e
    return fn(cfg, opts)
