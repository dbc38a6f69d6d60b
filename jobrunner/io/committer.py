"""Stage 4's bookkeeping: collect finished rows, price them, commit a shard every N rows or T s.

Each commit prices its rows by the work each caused (telemetry.cost.CostLedger): a row's own
share of the measured engine steps, plus a share of the time outside them; the committed rows'
cost_usd add up to the ledger's total, which the last commit makes the whole wall time.
Where a commit goes is the executor's: `into_rundir` (the local run: errors.jsonl, the next
shard name, manifest.json), or a Ray worker's block (an error fragment, the block's shard).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from jobrunner.io.rundir import Manifest, RunDir
from jobrunner.io.writers import result_record
from jobrunner.telemetry.cost import CostLedger, Savings
from jobrunner.telemetry.spill import SpillLog
from jobrunner.telemetry.timeline import ROW_COLUMNS, row_record
from jobrunner.types import Result, RowError

# (shard records, error rows, each record's source row)
Write = Callable[[list[dict[str, Any]], list[RowError], list[Any]], None]


def into_rundir(rundir: RunDir, manifest: Manifest) -> Write:
    """Commits in the run directory's order (errors.jsonl, then the shard, then the manifest)."""
    return lambda records, errors, sources: rundir.commit(manifest, records, errors, sources)


class Committer:
    def __init__(
        self,
        write: Write,
        model_name: str,
        usd_per_hour: float,
        shard_rows: int,
        shard_seconds: float,
        drain_errors: Callable[[], list[RowError]] = list,
        measured_seconds: Callable[[], float] = float,
        expected_rows: int = 0,
    ) -> None:
        self.write = write
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
        self.row_log = SpillLog(ROW_COLUMNS)  # per-row telemetry (telemetry/rows.parquet)
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

    def commit(self, final: bool = False) -> float:
        """Price and write the pending rows (and rejected ones); `final`: no rows follow (they
        pay what time is left). Returns the commit's cost in USD."""
        errors = self.errors + self.drain_errors()
        now = time.monotonic()
        before = self.ledger.cost_usd
        self.savings.add(self.ledger.price(self.pending, self.measured_seconds(), now, final))
        records = [result_record(r, self.model_name) for r in self.pending]
        self.row_log.extend(row_record(r) for r in self.pending)
        self.write(records, errors, [r.source for r in self.pending])
        self.rows_committed += len(records)
        self.pending, self.errors = [], []
        if records:
            self._last = now
        return self.ledger.cost_usd - before
