"""report.md: the job report as a Markdown page (the same figures as report.json)."""

from __future__ import annotations

import math
from typing import Any

from jobrunner.quant_check import markdown_lines
from jobrunner.telemetry.breakdown import PHASES
from jobrunner.telemetry.model import Report


def fmt(x: Any, spec: str = ",.2f") -> str:
    return "n/a" if x is None else format(x, spec)


def usd(x: float | None, spec: str | None = None) -> str:
    """Dollars with enough digits to show small amounts: $12.35, $0.0123, $0.000015."""
    if x is None:
        return "n/a"
    if spec is None:
        digits = (
            2
            if abs(x) >= 10
            else 4
            if abs(x) >= 0.01 or x == 0
            else 2 - math.floor(math.log10(abs(x)))
        )
        spec = f",.{digits}f"
    return f"${format(x, spec)}"


def to_markdown(r: Report) -> str:
    lines = [
        f"# Job report: {r.job}",
        "",
        f"Model `{r.model}` on {r.device.count} x {r.device.name} ({r.engine} engine).",
        "",
        *summary_table(r),
        *price_warning_lines(r),
        *markdown_lines(r.model_memory),
        *time_table(r),
        *api_table(r),
        *estimate_table(r),
    ]
    if r.notes:
        lines += ["Notes:", *[f"- {n}" for n in r.notes], ""]
    return "\n".join(lines)


def summary_table(r: Report) -> list[str]:
    rows, tok, tm, c, d = r.rows, r.tokens, r.time, r.cost, r.device
    energy = "not measured" if c.energy_kwh is None else f"{c.energy_kwh:.5f} kWh"
    return [
        "| what | value |",
        "| --- | --- |",
        f"| rows succeeded / failed | {rows.succeeded} / {rows.failed}"
        f" ({rows.skipped} already committed when the latest run started) |",
        f"| prompt tokens (cached) | {tok.prompt:,} ({tok.cached:,}) |",
        f"| completion tokens | {tok.completion:,} |",
        f"| wall / engine / forward seconds | {fmt(tm.wall_seconds, '.1f')} /"
        f" {fmt(tm.engine_seconds, '.1f')} / {fmt(tm.forward_seconds, '.1f')} |",
        f"| in forward passes, after model load | {fmt(tm.busy_fraction_after_load, '.0%')} |",
        f"| completion tokens/s | {fmt(r.throughput.completion_tokens_per_second, ',.1f')} |",
        f"| {d.unit_hours or 'device-hours'} | {fmt(d.device_hours, '.4f')} |",
        f"| cost | {usd(c.cost_usd)} at {usd(c.usd_per_hour, '.4f')}/h: {c.price_source} |",
        f"| $ per 1M input tokens | {usd(c.usd_per_1m_input_tokens, ',.4f')} |",
        f"| $ per 1M output tokens | {usd(c.usd_per_1m_output_tokens, ',.4f')} |",
        f"| $ per 1M tokens (input + output) | {usd(c.usd_per_1m_tokens, ',.4f')} |",
        f"| saved by the prefix cache | {usd(c.cache_saved_usd)} |",
        f"| saved by deduplication | {usd(c.dedup_saved_usd)} |",
        f"| energy | {energy} |",
        "",
    ]


def price_warning_lines(r: Report) -> list[str]:
    warnings = r.cost.price_warnings
    return [*[f"> Price warning: {w}" for w in warnings], ""] if warnings else []


def time_table(r: Report) -> list[str]:
    b = r.time.breakdown
    lines = ["## Where the time went", "", "| phase | seconds | cost |", "| --- | --- | --- |"]
    lines += [
        f"| {p} | {b['seconds'][p]:.2f} | {usd(b['usd'][p])} |"
        for p in PHASES
        if b["seconds"][p] > 0
    ]
    return [*lines, ""]


def api_table(r: Report) -> list[str]:
    lines = [
        "## The same tokens at hosted batch APIs",
        "",
        "| provider | model | batch $ in / cached in / out per 1M | cost | x ours | price date |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for a in r.api_equivalent:
        cached = a.get("usd_per_1m_cached_input")
        lines.append(
            f"| {a['provider']} | {a['model']} | ${a['usd_per_1m_input']} /"
            f" {'n/a' if cached is None else f'${cached}'} / ${a['usd_per_1m_output']}"
            f" | {usd(a['usd'])} | {fmt(a['ratio_to_ours'], ',.2f')}"
            f" | {a['date'] or 'undated'} |"
        )
    lines += ["", "Sources: " + "; ".join(sorted({a["source"] for a in r.api_equivalent}))]
    return [*lines, ""]


def estimate_table(r: Report) -> list[str]:
    e = r.estimate
    if not e:
        return []
    if e.get("other_settings"):
        which = ", ".join(e["other_settings"])
        return [
            "## Estimate vs actual",
            "",
            f"estimate.json was made for other settings ({which}) than this run's: not compared.",
            "",
        ]
    lines = [
        "## Estimate vs actual",
        "",
        f"Throughput model: {e['throughput_source']}; completion lengths: {e['completion_source']}.",
        "",
        "| figure | predicted | actual | error |",
        "| --- | --- | --- | --- |",
    ]
    for k, f in e["figures"].items():
        err = "n/a" if f["error_fraction"] is None else f"{f['error_fraction']:+.1%}"
        lines.append(
            f"| {k} | {fmt(f['predicted'], ',.6g')} | {fmt(f['actual'], ',.6g')} | {err} |"
        )
    return [*lines, ""]
