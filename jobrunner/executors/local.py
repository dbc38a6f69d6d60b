"""The local executor: the whole job in this process, on this machine's device."""

from __future__ import annotations

from jobrunner.pipeline import JobSummary, RunOptions, run_job


def run(cfg, opts: RunOptions) -> JobSummary:
    return run_job(cfg, opts)
