"""Telemetry for one invocation of a job: the sampler around it, the timelines after it.

The pipeline calls `RunTelemetry(path).start()` before loading the model and `finish(...)` after
the last commit; `finish` saves the timelines and returns the fields for the manifest's run record.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from jobrunner.telemetry.sampler import DEFAULT_INTERVAL, Sampler
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
        step_log: list[dict[str, Any]],
        savings: dict[str, float],
        row_log: list[dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        """Stop sampling, save the timelines; the fields to add to this run's record."""
        samples = self.sampler.stop()
        try:
            append_timeline(self.dir / DEVICE_FILE, samples, DEVICE_COLUMNS, run_index)
            append_timeline(self.dir / STEPS_FILE, step_log, STEP_COLUMNS, run_index)
            append_timeline(self.dir / ROWS_FILE, row_log or [], ROW_COLUMNS, run_index)
        except Exception as e:  # telemetry never fails a job that finished its rows
            log.warning("could not save telemetry timelines in %s: %s", self.dir, e)
        return {
            "energy_kwh": self.sampler.energy_kwh(),
            **savings,
            "sample_interval_s": self.sampler.interval,
        }
