"""The sampler and the Parquet timelines it leaves in the run directory."""

from __future__ import annotations

import time

import pytest

from jobrunner.telemetry.run import RunTelemetry
from jobrunner.telemetry.sampler import Sampler, energy_kwh
from jobrunner.telemetry.timeline import DEVICE_FILE, STEPS_FILE, read_timeline


def test_sampler_records_host_cpu_and_rss_on_a_timeline():
    s = Sampler(interval=0.05).start()
    sum(i * i for i in range(300_000))  # some CPU work to measure
    time.sleep(0.3)
    samples = s.stop()
    host = [x for x in samples if x["device"] == "host"]
    assert len(host) >= 3
    assert all(x["mem_used_bytes"] > 10_000_000 for x in host)  # this Python process's RSS
    assert all(0.0 <= x["util_percent"] <= 100.0 for x in host)
    assert [x["elapsed_s"] for x in host] == sorted(x["elapsed_s"] for x in host)
    assert s._thread is None  # stopped and joined


def test_energy_is_the_counter_difference_per_gpu():
    samples = [
        {"device": "cuda:0", "energy_mj": 1_000.0},
        {"device": "host", "energy_mj": None},
        {"device": "cuda:1", "energy_mj": 50.0},
        {"device": "cuda:0", "energy_mj": 3.6e9 + 1_000},
        {"device": "cuda:1", "energy_mj": 50.0 + 1.8e9},
    ]
    assert energy_kwh(samples) == pytest.approx(1.5)
    assert energy_kwh([{"device": "host", "energy_mj": None}]) is None


def test_timelines_append_per_run_and_a_rerun_replaces_its_own_rows(tmp_path):
    steps = [
        {"t": 0.1 * i, "num_running": i, "batch_tokens": 10 * i, "step_seconds": 0.1}
        for i in range(3)
    ]
    for run in (0, 1, 1):
        t = RunTelemetry(tmp_path, interval=0.05).start()
        rec = t.finish(run, steps, {"cache_saved_usd": 0.0})
        assert rec["cache_saved_usd"] == 0.0 and "energy_kwh" in rec
    saved = read_timeline(tmp_path, STEPS_FILE)
    assert [(r["run"], r["num_running"]) for r in saved] == [
        (0, 0),
        (0, 1),
        (0, 2),
        (1, 0),
        (1, 1),
        (1, 2),
    ]
    assert (
        saved[0]["prefill_tokens"] is None
    )  # an engine that does not log a column leaves it empty
    device = read_timeline(tmp_path, DEVICE_FILE)
    assert {r["run"] for r in device} == {0, 1}
    assert (tmp_path / "telemetry" / "device.parquet").is_file()


def test_gpu_readings_through_nvml():
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
    except Exception:
        pytest.skip("no NVIDIA driver here")
    pynvml.nvmlShutdown()
    s = Sampler(interval=0.05).start()
    time.sleep(0.2)
    gpu = [x for x in s.stop() if x["device"].startswith("cuda")]
    assert gpu and all(x["mem_total_bytes"] > 0 for x in gpu)
    assert any(x["power_w"] is not None for x in gpu)


def test_a_run_that_fails_after_sampling_started_leaves_no_sampler_thread(tmp_path, monkeypatch):
    """run_job used as a library (an Airflow task) must not leak a sampling thread per failure."""
    import threading

    from jobrunner.config import JobConfig
    from jobrunner.engine import loader
    from jobrunner.pipeline import run_job

    def broken_load(*args, **kwargs):
        raise RuntimeError("weights unreadable")

    monkeypatch.setattr(loader, "load_model", broken_load)
    data = tmp_path / "in.jsonl"
    data.write_text('{"id": "a", "prompt": "hi"}\n', encoding="utf-8")
    cfg = JobConfig()
    cfg.input.path = str(data)
    cfg.output.path = str(tmp_path / "out")
    with pytest.raises(RuntimeError, match="weights unreadable"):
        run_job(cfg)
    assert not [t for t in threading.enumerate() if t.name == "jobrunner-sampler"]
