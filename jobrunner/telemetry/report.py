"""The job report, rebuilt from the run directory alone (no model, no GPU).

Totals are sums over the committed rows, so they always agree with the results; time, device
and engine figures come from the per-invocation records in the manifest (`runs`) and from the
timelines in telemetry/. `write_reports` writes report.json, report.md, report.html, metrics.prom.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from jobrunner.io.rundir import RunDir
from jobrunner.io.writers import naming, write_text_atomic
from jobrunner.quant_check import report_section
from jobrunner.telemetry.breakdown import time_breakdown
from jobrunner.telemetry.cost import per_million
from jobrunner.telemetry.model import (
    Cost,
    Device,
    Report,
    Rows,
    Telemetry,
    Throughput,
    Time,
    Tokens,
    iter_token_columns,
)
from jobrunner.telemetry.prices import api_equivalent, api_prices_of_run, price_warnings
from jobrunner.telemetry.prom import write_metrics
from jobrunner.telemetry.record import ENGINE_COUNTERS, RunRecord
from jobrunner.telemetry.report_html import to_html
from jobrunner.telemetry.report_md import to_markdown
from jobrunner.telemetry.step_totals import StepTotals, step_totals
from jobrunner.telemetry.timeline import DEVICE_FILE, read_timeline

ESTIMATE_FILE = "estimate.json"


def row_totals(rundir: RunDir) -> dict[str, Any]:
    t = {
        "rows": 0,
        "prompt_tokens": 0,
        "cached_tokens": 0,
        "completion_tokens": 0,
        "cost_usd": 0.0,
        "finish_reasons": {},
    }
    for rec in iter_token_columns(rundir):
        t["rows"] += 1
        for k in ("prompt_tokens", "cached_tokens", "completion_tokens", "cost_usd"):
            t[k] += rec[k] or 0
        fr = t["finish_reasons"]
        fr[rec["finish_reason"]] = fr.get(rec["finish_reason"], 0) + 1
    return t


def build_report(rundir: RunDir) -> Report:
    m = rundir.load_manifest()
    runs = [RunRecord.from_json(r) for r in (m.runs if m else [])]
    t = row_totals(rundir)
    failed = sum(1 for _ in rundir.iter_errors())
    ok = t["rows"] - t["finish_reasons"].get("error", 0)
    last = runs[-1] if runs else RunRecord(job=None, model=None, engine=None)
    tokens = t["prompt_tokens"] + t["completion_tokens"]
    steps = step_totals(rundir.path)
    time = _time(runs, steps)
    wall = time.wall_seconds
    report = Report(
        job=last.job,
        model=last.model,
        engine=last.engine,
        rows=Rows(ok, failed, last.skipped, ok + failed),
        finish_reasons=t["finish_reasons"],
        tokens=Tokens(
            t["prompt_tokens"],
            t["cached_tokens"],
            t["prompt_tokens"]
            - t["cached_tokens"]
            - round(sum(r.dedup_prompt_tokens for r in runs)),
            t["completion_tokens"],
            tokens,
        ),
        time=time,
        throughput=Throughput(
            t["completion_tokens"] / wall if wall else None,
            tokens / wall if wall else None,
            t["rows"] / wall if wall else None,
        ),
        device=_device(runs, last),
        cost=_cost(t, runs, tokens, m.retired_cost_usd if m else 0.0),
        api_equivalent=api_equivalent(
            t["prompt_tokens"],
            t["completion_tokens"],
            t["cost_usd"],
            api_prices_of_run(last.to_json()),
        ),
        telemetry=device_summary(read_timeline(rundir.path, DEVICE_FILE), steps),
        model_memory=report_section(last.weights),
        engine_stats={k: sum(getattr(r, k) for r in runs) for k in ENGINE_COUNTERS},
        notes=[n for r in runs for n in r.notes],
        runs=len(runs),
        workers=[w for r in runs for w in r.workers],
        finished_at=m.finished_at if m else None,
    )
    fp = m.fingerprint if m else {}
    report.estimate = compare_estimate(rundir.path / ESTIMATE_FILE, report, fp)
    report.cost.price_warnings = price_warnings(report.cost.price_date, report.api_equivalent)
    return report


def _time(runs: list[RunRecord], steps: StepTotals) -> Time:
    wall = sum(r.wall_seconds for r in runs)
    engine = sum(r.engine_seconds for r in runs)
    forward = sum(r.forward_seconds for r in runs)
    load = sum(r.load_seconds for r in runs)
    return Time(
        wall,
        engine,
        forward,
        load,
        engine_busy_fraction=forward / wall if wall else None,
        busy_fraction_after_load=forward / (wall - load) if wall > load else None,
        forward_fraction_of_engine=forward / engine if engine else None,
        breakdown=time_breakdown(runs, steps.phases),
    )


def _device(runs: list[RunRecord], last: RunRecord) -> Device:
    device_hours = sum(r.wall_seconds * r.device_count for r in runs) / 3600
    return Device(
        last.device_name,
        last.device_kind,
        last.device_count if runs else None,
        device_hours,
        f"{_unit(last.device_kind)}s",
        device_hours if last.device_kind == "cuda" else 0.0,
    )


def _cost(t: dict[str, Any], runs: list[RunRecord], tokens: int, retired: float = 0.0) -> Cost:
    """The committed rows' cost, plus failed attempts that --retry-errors ran again (paid)."""
    last = runs[-1] if runs else RunRecord(usd_per_hour=None, price_source=None)
    energy = [r.energy_kwh for r in runs if r.energy_kwh is not None]
    cache = sum(r.cache_saved_usd for r in runs)
    dedup = sum(r.dedup_saved_usd for r in runs)
    usd = t["cost_usd"] + retired
    return Cost(
        cost_usd=usd,
        retried_attempts_usd=retired,
        usd_per_hour=last.usd_per_hour,
        price_source=last.price_source,
        price_unit=last.price_unit or _unit(last.device_kind),
        price_date=last.price_date,
        usd_per_1m_input_tokens=per_million(usd, t["prompt_tokens"]),
        usd_per_1m_output_tokens=per_million(usd, t["completion_tokens"]),
        usd_per_1m_tokens=per_million(usd, tokens),
        cache_saved_usd=cache,
        dedup_saved_usd=dedup,
        cost_without_savings_usd=usd + cache + dedup,
        energy_kwh=sum(energy) if energy else None,
    )


def _unit(device_kind: str | None) -> str:
    return "GPU-hour" if device_kind == "cuda" else "vCPU-hour"


def device_summary(samples: list[dict[str, Any]], steps: StepTotals) -> Telemetry:
    """Means and peaks of the sampled timelines (None where nothing was measured)."""

    def stat(device_prefix: str, key: str, fn) -> float | None:
        vals = [
            s[key] for s in samples if _kind(s).startswith(device_prefix) and s[key] is not None
        ]
        return fn(vals) if vals else None

    def mean(v):
        return sum(v) / len(v)

    return Telemetry(
        samples=len(samples),
        gpu_util_mean_percent=stat("cuda", "util_percent", mean),
        gpu_power_mean_w=stat("cuda", "power_w", mean),
        gpu_mem_peak_bytes=stat("cuda", "mem_used_bytes", max),
        host_cpu_mean_percent=stat("host", "util_percent", mean),
        host_rss_peak_bytes=stat("host", "mem_used_bytes", max),
        kv_blocks_peak=_int(steps.kv_blocks_peak),
        running_peak=_int(steps.running_peak),
    )


def _int(v: float | None) -> int | None:
    return None if v is None else int(v)


def _kind(sample: dict[str, Any]) -> str:
    """`cuda:0` or `host`, also for a Ray worker's sample (`10.0.0.5:4242 cuda:0`)."""
    return sample["device"].rsplit(" ", 1)[-1]


def compare_estimate(
    path: Path, report: Report, fingerprint: dict[str, str]
) -> dict[str, Any] | None:
    """Predicted (by `jobrunner estimate`) against actual, with the relative error of each; an
    estimate made for other settings than the run's (the job file edited since) is not compared
    and says which differ."""
    if not path.is_file():
        return None
    est = json.loads(path.read_text(encoding="utf-8"))
    made_for = est.get("settings") or {}
    other = sorted(k for k, v in made_for.items() if fingerprint and fingerprint.get(k) != v)
    if other:
        return {"created_at": est.get("created_at"), "other_settings": other}
    actual = {
        "rows": report.rows.total,
        "prompt_tokens": report.tokens.prompt,
        "completion_tokens": report.tokens.completion,
        "wall_seconds": report.time.wall_seconds,
        "cost_usd": report.cost.cost_usd,
    }
    out: dict[str, Any] = {
        "created_at": est.get("created_at"),
        "throughput_source": est.get("throughput", {}).get("source"),
        "completion_source": est.get("completion_source"),
        "figures": {},
    }
    for key, a in actual.items():
        p = est.get(key)
        err = (p - a) / a if p is not None and a else None
        out["figures"][key] = {"predicted": p, "actual": a, "error_fraction": err}
    return out


REPORT_FILES = ("report.json", "report.md", "report.html", "metrics.prom")  # write_reports'


def write_reports(rundir: RunDir) -> Report:
    report = build_report(rundir)
    text = json.dumps(report.to_json(), indent=2, sort_keys=True)
    write_text_atomic(rundir.path / "report.json", text)
    write_text_atomic(rundir.path / "report.md", to_markdown(report))
    write_text_atomic(rundir.path / "report.html", to_html(report, rundir))
    with naming(rundir.path / "metrics.prom"):
        write_metrics(report, rundir.path / "metrics.prom")
    rundir.publish()
    return report
