"""The progress line a cron log shows while a job runs."""

from __future__ import annotations

import logging
import time
from types import SimpleNamespace

from jobrunner.telemetry.progress import Progress
from jobrunner.types import FinishReason, Result, Usage


def test_log_line_counts_tokens_generated_before_any_row_finishes(caplog, monkeypatch):
    """A continuous-batching engine has generated thousands of tokens before its first row
    finishes; the log says so instead of "0 tok/s"."""
    monkeypatch.setenv("JOBRUNNER_NO_PROGRESS", "1")
    live = SimpleNamespace(generated_tokens=0, prefill_tokens=0)  # the engine's live counters
    caplog.set_level(logging.INFO, logger="jobrunner.progress")
    progress = Progress(240, log_every=0.05, live=live)
    try:
        live.generated_tokens, live.prefill_tokens = 12_345, 67_890
        deadline = time.monotonic() + 10
        while "12,345 tokens generated" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        progress.close()
    assert "0/240 rows, 12,345 tokens generated (" in caplog.text
    assert "67,890 prompt tokens computed" in caplog.text
    assert not progress._ticker.is_alive()  # close() stops the ticker


def test_finished_rows_count_when_the_engine_reports_no_live_tokens(monkeypatch):
    monkeypatch.setenv("JOBRUNNER_NO_PROGRESS", "1")
    progress = Progress(3, log_every=60)
    try:
        rows = [
            Result(str(i), "x", FinishReason.LENGTH, Usage(completion_tokens=7)) for i in range(2)
        ]
        progress.advance(rows)
    finally:
        progress.close()
    assert progress.done == 2 and progress.generated == 14
    assert progress.line().startswith("2/3 rows, 14 tokens generated")
