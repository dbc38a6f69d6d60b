"""Stage 4's bookkeeping: collect finished rows, price them, commit a shard every N rows or T s.

Each commit prices its rows by the work each caused (telemetry.cost.CostLedger): a row's own
share of the measured engine steps, plus a share of the time outside them; the committed rows'
cost_usd add up to the ledger's total, which the last commit makes the whole wall time.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from jobrunner.io.rundir import Manifest, RunDir
from jobrunner.io.writers import result_record
from jobrunner.telemetry.cost import CostLedger, Savings
from jobrunner.telemetry.timeline import row_record
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
        measured_seconds: Callable[[], float] = float,
        expected_rows: int = 0,
    ) -> None:
        self.rundir = rundir
        self.manifest = manifest
        self.model_name = model_name
        self.ledger = CostLedger(usd_per_hour, expected_rows)
        self.measured_seconds = measured_seconds  # the engine's step time so far
        self.shard_rows = shard_rows
        self.shard_seconds = shard_seconds
        self.drain_errors = drain_errors
        self.pending: list[Result] = []
        self.errors: list[RowError] = []
        self.savings = Savings()  # what the prefix cache and dedup saved, in USD
        self.rows_committed = 0
        self.row_log: list[dict] = []  # per-row telemetry (telemetry/rows.parquet)
        self._last = time.monotonic()

    def start_clock(self, since: float | None = None) -> None:
        """Time from `since` (time.monotonic(); default now) is charged to the rows."""
        self._last = time.monotonic() if since is None else since
        self.ledger.start = self._last

    @property
    def cost_usd(self) -> float:
        return self.ledger.cost_usd

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

    def commit(self, final: bool = False) -> None:
        """Commit the pending rows; `final`: no rows follow (they pay what time is left)."""
        errors = self.errors + self.drain_errors()
        now = time.monotonic()
        self.savings.add(self.ledger.price(self.pending, self.measured_seconds(), now, final))
        records = [result_record(r, self.model_name) for r in self.pending]
        self.row_log += [row_record(r) for r in self.pending]
        self.rundir.commit(self.manifest, records, errors, [r.source for r in self.pending])
        self.rows_committed += len(records)
        self.pending, self.errors = [], []
        if records:
            self._last = now
