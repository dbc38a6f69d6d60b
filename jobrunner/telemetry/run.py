"""Telemetry for one invocation of a job: the sampler around it, the timelines after it.

The pipeline calls `RunTelemetry(path).start()` before loading the model and `finish(...)` after
the last commit; `finish` saves the timelines and returns the fields for the manifest's run record.
The Ray driver saves its workers' timeline rows with `save_timelines`.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from jobrunner.telemetry.sampler import DEFAULT_INTERVAL, Sampler
from jobrunner.telemetry.spill import SpillLog
from jobrunner.telemetry.timeline import (
    DEVICE_COLUMNS,
    DEVICE_FILE,
    ROW_COLUMNS,
    ROWS_FILE,
    STEP_COLUMNS,
    STEPS_FILE,
    append_timeline,
    telemetry_dir,
)

log = logging.getLogger(__name__)

INTERVAL_ENV = "JOBRUNNER_SAMPLE_INTERVAL"


def save_timelines(
    tdir: Path,
    run_index: int,
    samples: list[dict[str, Any]],
    steps: list[dict[str, Any]] | SpillLog,
    rows: list[dict[str, Any]] | SpillLog,
) -> None:
    """Append one run's device samples, engine steps and rows (any number of workers') to the
    job's timelines."""
    try:
        append_timeline(tdir / DEVICE_FILE, samples, DEVICE_COLUMNS, run_index)
        append_timeline(tdir / STEPS_FILE, steps, STEP_COLUMNS, run_index)
        append_timeline(tdir / ROWS_FILE, rows, ROW_COLUMNS, run_index)
    except Exception as e:  # telemetry never fails a job that finished its rows
        log.warning("could not save telemetry timelines in %s: %s", tdir, e)


class RunTelemetry:
    def __init__(self, run_path: str | Path, interval: float | None = None) -> None:
        self.dir = telemetry_dir(run_path)
        self.sampler = Sampler(interval or float(os.environ.get(INTERVAL_ENV, DEFAULT_INTERVAL)))

    def start(self) -> RunTelemetry:
        self.sampler.start()
        return self

    def finish(
        self,
        run_index: int,
        step_log: list[dict[str, Any]] | SpillLog,
        savings: dict[str, float],
        row_log: list[dict[str, Any]] | SpillLog | None = None,
    ) -> dict[str, Any]:
        """Stop sampling, save the timelines; the fields to add to this run's record."""
        save_timelines(self.dir, run_index, self.sampler.stop(), step_log, row_log or [])
        return {
            "energy_kwh": self.sampler.energy_kwh(),
            **savings,
            "sample_interval_s": self.sampler.interval,
        }
