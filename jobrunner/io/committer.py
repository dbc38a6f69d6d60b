"""Stage 4's bookkeeping: collect finished rows, price them, commit a shard every N rows or T s.

Each commit shares the wall time since the previous commit out to the rows it holds (by work,
see telemetry.cost), so the committed rows' cost_usd always add up to the money spent so far.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from jobrunner.io.rundir import Manifest, RunDir
from jobrunner.io.writers import result_record
from jobrunner.telemetry.cost import Savings, share_cost
from jobrunner.types import Result, RowError


class Committer:
    def __init__(
        self,
        rundir: RunDir,
        manifest: Manifest,
        model_name: str,
        usd_per_hour: float,
        shard_rows: int,
        shard_seconds: float,
        drain_errors: Callable[[], list[RowError]] = list,
    ) -> None:
        self.rundir = rundir
        self.manifest = manifest
        self.model_name = model_name
        self.usd_per_second = usd_per_hour / 3600.0
        self.shard_rows = shard_rows
        self.shard_seconds = shard_seconds
        self.drain_errors = drain_errors
        self.pending: list[Result] = []
        self.errors: list[RowError] = []
        self.cost_usd = 0.0
        self.savings = Savings()  # what the prefix cache and dedup saved, in USD
        self.rows_committed = 0
        self._last = time.monotonic()

    def start_clock(self, since: float | None = None) -> None:
        """Time from `since` (time.monotonic(); default now) is charged to the next rows."""
        self._last = time.monotonic() if since is None else since

    def add(self, results: list[Result]) -> None:
        self.pending.extend(results)
        for r in results:
            if not r.ok:
                self.errors.append(RowError(r.error_code or "error", r.error or "", r.source, r.id))
        if self.due:
            self.commit()

    @property
    def due(self) -> bool:
        return len(self.pending) >= self.shard_rows or (
            time.monotonic() - self._last >= self.shard_seconds and bool(self.pending)
        )

    def commit(self) -> None:
        errors = self.errors + self.drain_errors()
        now = time.monotonic()
        usd = (now - self._last) * self.usd_per_second if self.pending else 0.0
        self.savings.add(share_cost(self.pending, usd))
        records = [result_record(r, self.model_name) for r in self.pending]
        self.rundir.commit(self.manifest, records, errors)
        self.cost_usd += usd
        self.rows_committed += len(records)
        self.pending, self.errors = [], []
        if records:
            self._last = now
