"""The progress a person reads (bar) and a cron log shows (line): both move from the first step."""

from __future__ import annotations

import logging
import time
from types import SimpleNamespace

import pytest

from jobrunner.telemetry.progress import Progress
from jobrunner.types import Choice, FinishReason, Result, Usage


@pytest.fixture(autouse=True)
def no_bar(monkeypatch):
    monkeypatch.setenv("JOBRUNNER_NO_PROGRESS", "1")


def live(**kw):
    """The engine's live counters."""
    base = dict(generated_tokens=0, prefill_tokens=0, cached_tokens=0, step_log=[])
    return SimpleNamespace(**{**base, **kw})


def prompts(tokens, rows, done=True):
    """The prep stream's counters."""
    return SimpleNamespace(prompt_tokens=tokens, rows_read=rows, read_done=done)


def test_log_line_moves_during_prefill_before_any_row_finishes(caplog):
    """For minutes a job only prefills prompts: the log says how far, not `0 rows 1 tok/s`."""
    counters = live()
    caplog.set_level(logging.INFO, logger="jobrunner.progress")
    progress = Progress(240, log_every=0.05, live=counters, prompt=prompts(58_659, 240))
    try:
        counters.prefill_tokens, counters.cached_tokens = 12_000, 345
        deadline = time.monotonic() + 10
        while "12,345/58,659" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        progress.close()
    assert "prompt 12,345/58,659 tok " in caplog.text
    assert "rows 0/240" in caplog.text
    assert not progress._ticker.is_alive()  # close() stops the ticker


def test_generated_tokens_count_before_rows_finish():
    progress = Progress(240, log_every=60, live=live(generated_tokens=12_345, prefill_tokens=900))
    try:
        assert "rows 0/240 · 12,345 tok" in progress.line()
    finally:
        progress.close()


def decode_steps(n, tokens, seconds, prefill=0):
    """A step log: n steps of `tokens` decode tokens, `seconds` apart."""
    return [
        {"t": i * seconds, "prefill_tokens": prefill, "decode_tokens": tokens, "step_seconds": 0}
        for i in range(n)
    ]


def test_eta_is_prompt_tokens_left_then_tokens_left_to_generate():
    counters = live(step_log=decode_steps(5, 10, 0.1))  # decode-only steps: 100 tok/s
    now = [0.0]
    progress = Progress(
        10, 60, counters, prompts(5000, 10), max_new_tokens=50, clock=lambda: now[0]
    )
    try:
        now[0] = 2.0  # in 2 s: 2,000 prompt tokens and 100 generated
        counters.prefill_tokens, counters.generated_tokens = 2000, 100
        snap = progress.snapshot()
    finally:
        progress.close()
    # 3,000 prompt tokens left at 1,000 tok/s: 3 s, while rows generate 150 more tokens; of the
    # 10 rows x 50 tokens, 500 - 100 - 150 = 250 are left after it, at 100 tok/s: 2.5 s
    assert snap.prefill_eta == pytest.approx(3.0)
    assert snap.eta == pytest.approx(5.5)
    assert snap.fraction() == pytest.approx(2.0 / 7.5)
    assert snap.text() == (
        "prompt 2,000/5,000 tok 1,000/s · rows 0/10 · 100 tok 50/s · ETA 0:00:06 · 0:00:02 elapsed"
    )


def test_the_mean_completion_of_finished_rows_replaces_max_new_tokens():
    counters = live(generated_tokens=40, step_log=decode_steps(5, 10, 0.1))
    progress = Progress(4, log_every=60, live=counters, prompt=prompts(100, 4), max_new_tokens=500)
    try:
        counters.prefill_tokens = 100
        rows = [
            Result(
                str(i), [Choice(0, "x", [1] * 20, FinishReason.STOP)], Usage(completion_tokens=20)
            )
            for i in (0, 1)
        ]
        progress.advance(rows)
        snap = progress.snapshot()
    finally:
        progress.close()
    assert snap.eta == pytest.approx(0.4)  # 2 rows x 20 tokens at 100 tok/s, none in flight
    assert "prompt 100 tok done" in snap.text() and "rows 2/4" in snap.text()


def test_before_any_decode_only_step_the_line_says_when_prefill_ends():
    counters = live(step_log=decode_steps(3, 2, 1.0, prefill=500))  # mixed steps only
    now = [0.0]
    progress = Progress(10, 60, counters, prompts(4000, 10), clock=lambda: now[0])
    try:
        now[0], counters.prefill_tokens = 1.0, 1000  # 1,000 tok/s
        assert "prefill ends in 0:00:03 ·" in progress.line()
        now[0] = 2.5  # no step has ended since: the time left counts down
        assert "prefill ends in 0:00:02 ·" in progress.line()
    finally:
        progress.close()


def test_prompt_total_is_extrapolated_until_the_input_is_read():
    progress = Progress(100, log_every=60, live=live(), prompt=prompts(1000, 10, done=False))
    try:
        assert progress.prompt_total() == 10_000
        progress.prompt = prompts(9_000, 100, done=True)
        assert progress.prompt_total() == 9_000
    finally:
        progress.close()


def test_finished_rows_count_when_the_engine_reports_no_live_tokens():
    progress = Progress(3, log_every=60)
    try:
        rows = [
            Result(
                str(i), [Choice(0, "x", [1] * 7, FinishReason.LENGTH)], Usage(completion_tokens=7)
            )
            for i in range(2)
        ]
        progress.advance(rows)
    finally:
        progress.close()
    assert progress.done == 2 and progress.generated == 14
    assert "rows 2/3 · 14 tok" in progress.line()


def test_rows_still_running_past_the_mean_are_not_taken_as_done():
    """The first row to finish is a short one: the rows still running have more to go."""
    steps = [{**s, "num_running": 2} for s in decode_steps(5, 2, 1.0)]  # 2 tok/s
    counters = live(prefill_tokens=100, generated_tokens=42, step_log=steps)
    progress = Progress(3, 60, counters, prompts(100, 3), max_new_tokens=128)
    try:
        choice = Choice(0, "x", [1] * 14, FinishReason.STOP)
        progress.advance([Result("a", [choice], Usage(completion_tokens=14))])
        snap = progress.snapshot()
    finally:
        progress.close()
    # 2 rows running with 14 tokens each, the mean: each is taken to stop at (128 + 14) / 2
    assert snap.eta == pytest.approx(2 * 57 / 2.0)
    assert snap.fraction() < 1.0


def test_a_job_that_generates_nothing_shows_no_generation_and_its_eta_is_the_prompts():
    """An embedding job: no `0 tok 0.0/s`, and its ETA is the prompt tokens left."""
    counters = live()
    now = [0.0]
    progress = Progress(10, 60, counters, prompts(5000, 10), max_new_tokens=0, clock=lambda: now[0])
    try:
        now[0] = 2.0
        counters.prefill_tokens = 2000
        progress.add(4, 0)
        snap = progress.snapshot()
    finally:
        progress.close()
    assert snap.eta == pytest.approx(3.0)  # 3,000 tokens left at 1,000 tok/s
    assert (
        snap.text() == "prompt 2,000/5,000 tok 1,000/s · rows 4/10 · ETA 0:00:03 · 0:00:02 elapsed"
    )
