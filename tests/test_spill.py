"""Per-step and per-row telemetry in bounded memory: the log spills to Parquet parts, the
timelines are written and read batch by batch, and what the report derives from them is the
same as from the whole list."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from jobrunner.telemetry import prom
from jobrunner.telemetry.breakdown import run_phases
from jobrunner.telemetry.record import RunRecord
from jobrunner.telemetry.spill import SpillLog
from jobrunner.telemetry.step_totals import step_totals
from jobrunner.telemetry.timeline import (
    ROW_COLUMNS,
    ROWS_FILE,
    STEP_COLUMNS,
    STEPS_FILE,
    append_timeline,
    read_timeline,
    sample_timeline,
    telemetry_dir,
)


def step(i: int) -> dict:
    return {
        "t": 0.01 * i,
        "num_running": i % 7,
        "prefill_tokens": (i % 3) * 10,
        "decode_tokens": i % 5,
        "kv_blocks_used": i % 11,
        "step_seconds": 0.001 * (1 + i % 13),
    }


def test_the_log_keeps_a_chunk_in_memory_and_reads_like_a_list():
    log = SpillLog(STEP_COLUMNS, chunk=10)
    records = [step(i) for i in range(37)]
    log.extend(records)
    assert len(log) == 37 and len(log.mem) == 7 and len(log.parts) == 3
    plain = [{c: r.get(c) for c in STEP_COLUMNS} for r in records]
    assert [r["t"] for r in log] == [r["t"] for r in plain]
    assert log[-1]["t"] == records[-1]["t"] and log[5]["num_running"] == records[5]["num_running"]
    assert [r["t"] for r in log[25:]] == [r["t"] for r in records[25:]]  # spans a part
    assert [r["t"] for r in log[-3:]] == [r["t"] for r in records[-3:]]  # from memory
    folder = log.parts[0][0].parent
    assert folder.is_dir()
    log.close()
    assert not folder.exists() and len(log) == 0


def test_a_spilled_log_lands_in_the_timeline_as_a_list_would(tmp_path):
    records = [step(i) for i in range(1000)]
    log = SpillLog(STEP_COLUMNS, chunk=64)
    log.extend(records)
    append_timeline(telemetry_dir(tmp_path) / STEPS_FILE, records[:10], STEP_COLUMNS, 0)
    append_timeline(telemetry_dir(tmp_path) / STEPS_FILE, log, STEP_COLUMNS, 1)
    saved = read_timeline(tmp_path, STEPS_FILE)
    assert [r["run"] for r in saved] == [0] * 10 + [1] * 1000
    assert [r["step_seconds"] for r in saved[10:]] == pytest.approx(
        [r["step_seconds"] for r in records]
    )
    # the same run appended again replaces its rows
    append_timeline(telemetry_dir(tmp_path) / STEPS_FILE, log, STEP_COLUMNS, 1)
    assert len(read_timeline(tmp_path, STEPS_FILE)) == 1010


def test_step_totals_equal_the_per_step_sums(tmp_path):
    records = [step(i) for i in range(500)] + [{"t": 9.0, "step_seconds": 0.5}]  # no counts
    append_timeline(telemetry_dir(tmp_path) / STEPS_FILE, records, STEP_COLUMNS, 0)
    totals = step_totals(tmp_path)
    run = RunRecord(job="j", model="m", engine="paged", wall_seconds=10.0, engine_seconds=5.0)
    expected = run_phases(run, records)
    assert totals.phases[0] == pytest.approx(
        {k: expected[k] for k in ("prefill", "decode", "forward")}
    )
    assert totals.kv_blocks_peak == 10 and totals.running_peak == 6


def test_histograms_count_every_row_and_step(tmp_path):
    rows = [
        {"first_token_seconds": 0.02 * i, "completion_tokens": i % 4, "decode_seconds": 0.01 * i}
        for i in range(300)
    ]
    append_timeline(telemetry_dir(tmp_path) / ROWS_FILE, rows, ROW_COLUMNS, 0)
    append_timeline(
        telemetry_dir(tmp_path) / STEPS_FILE, [step(i) for i in range(90)], STEP_COLUMNS, 0
    )
    from prometheus_client import CollectorRegistry, generate_latest

    reg = CollectorRegistry()
    reg.register(prom.LatencyHistograms("h", tmp_path))
    text = generate_latest(reg).decode()
    samples = {
        (s.name, s.labels.get("le")): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }
    assert samples[("jobrunner_time_to_first_token_seconds_count", None)] == 300
    assert samples[("jobrunner_time_to_first_token_seconds_bucket", "0.1")] == sum(
        1 for r in rows if r["first_token_seconds"] <= 0.1
    )
    assert samples[("jobrunner_time_to_first_token_seconds_sum", None)] == pytest.approx(
        sum(r["first_token_seconds"] for r in rows)
    )
    assert samples[("jobrunner_time_per_output_token_seconds_count", None)] == sum(
        1 for r in rows if r["completion_tokens"] > 1
    )
    assert samples[("jobrunner_step_duration_seconds_count", None)] == 90


def test_a_chart_samples_a_long_timeline_evenly(tmp_path):
    records = [step(i) for i in range(100_003)]
    append_timeline(telemetry_dir(tmp_path) / STEPS_FILE, records, STEP_COLUMNS, 0)
    sample, stride = sample_timeline(tmp_path, STEPS_FILE, 1000)
    assert stride == 101 and len(sample) <= 1000
    assert [r["t"] for r in sample] == pytest.approx(
        [records[i]["t"] for i in range(0, 100_003, 101)]
    )
