"""RunRecord: the one shape of manifest.json's run records, and how Ray workers' merge."""

from __future__ import annotations

import pytest

from jobrunner.telemetry.record import RunRecord


def worker(**kw) -> RunRecord:
    base = {
        "job": "j",
        "model": "m",
        "engine": "paged",
        "device_name": "GPU",
        "device_kind": "cuda",
        "device_count": 1,
        "usd_per_hour": 2.0,
    }
    return RunRecord(**{**base, **kw})


def test_workers_merge_into_the_pools_record():
    a = worker(
        load_seconds=10.0,
        engine_seconds=40.0,
        steps=5,
        deduplicated=1,
        cache_saved_usd=0.5,
        notes=["x"],
    )
    b = worker(load_seconds=12.0, engine_seconds=20.0, steps=7, cache_saved_usd=0.25, notes=["x"])
    b.load_parts = {"imports": 5.0, "model": 7.0}
    m = RunRecord.merge([a, b], executor="ray", wall_seconds=99.0)
    assert (m.executor, m.wall_seconds, m.load_seconds) == ("ray", 99.0, 12.0)
    assert m.load_parts == {"imports": 5.0, "model": 7.0}  # the slowest worker's
    assert m.engine_seconds == pytest.approx(30.0)  # the mean: busy fractions stay per device
    assert (m.steps, m.deduplicated, m.cache_saved_usd) == (12, 1, 0.75)
    assert (m.device_count, m.usd_per_hour, m.notes) == (2, 4.0, ["x"])


def test_a_record_round_trips_through_json_keeping_fields_it_does_not_name():
    rec = worker(weights={"quantization": "int8", "weight_bytes": 7}, extra={"work_units": 3.0})
    data = rec.to_json()
    assert data["quantization"] == "int8" and data["work_units"] == 3.0  # flat, as stored
    assert "workers" not in data  # a local run has no workers
    assert RunRecord.from_json(data) == rec


def test_the_record_of_a_started_engine_names_its_counters_price_and_weights():
    from types import SimpleNamespace

    from jobrunner.config import JobConfig
    from jobrunner.engine.base import EngineStats
    from jobrunner.telemetry.device import DeviceInfo
    from jobrunner.telemetry.prices import device_rate

    stats = EngineStats(engine_seconds=4.0, steps=9, kv_bytes_per_token=64)
    started = SimpleNamespace(
        engine=SimpleNamespace(kind="paged", stats=stats),
        load_seconds=2.5,
        load_parts={"imports": 1.0, "model": 1.5},
        weights={"quantization": "none"},
    )
    device = DeviceInfo("cpu", "AMD EPYC", 2)
    rate = device_rate(device, JobConfig().cost)
    rec = RunRecord.of_engine(JobConfig(), started, device, rate, wall_seconds=8.0, work_units=5)
    assert (rec.engine, rec.steps, rec.load_seconds, rec.wall_seconds) == ("paged", 9, 2.5, 8.0)
    assert rec.load_parts == {"imports": 1.0, "model": 1.5}
    assert (rec.usd_per_hour, rec.price_source) == (rate.usd_per_hour, rate.label)
    assert rec.price_unit == rate.price.unit and rec.device_count == 2
    assert rec.weights["quantization"] == "none" and rec.weights["kv_bytes_per_token"] == 64
    assert rec.extra == {"work_units": 5}


def test_a_report_json_of_any_version_reads_as_the_typed_report():
    from jobrunner.telemetry.model import Cost, Report, Rows

    old = {"job": "j", "rows": {"succeeded": 3, "failed": 1, "total": 4}, "cost": {"cost_usd": 2.0}}
    r = Report.from_json({**old, "from_the_future": 1})
    assert r.rows == Rows(succeeded=3, failed=1, skipped=0, total=4)
    assert (r.cost.cost_usd, r.cost.price_warnings, r.time.busy_fraction_after_load) == (
        2.0,
        [],
        None,
    )
    assert isinstance(r.cost, Cost) and "from_the_future" not in r.to_json()
    assert Report.from_json(r.to_json()) == r  # report.json round-trips
