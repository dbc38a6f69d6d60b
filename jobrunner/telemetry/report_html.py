"""report.html: one self-contained page (plotly's JavaScript inlined; no network needed).

Headline tiles answer the three questions first (what did it cost per 1M tokens, where did the
time go, what did the cache save); the charts and tables follow. A page-level error hook records
script errors in `body[data-errors]`, and `body[data-charts]` counts the charts drawn (tests and
scripts/screenshot_report.py read both).
"""

from __future__ import annotations

import html
import itertools
from typing import Any

from jobrunner.io.rundir import RunDir
from jobrunner.quant_check import markdown_lines
from jobrunner.telemetry import charts
from jobrunner.telemetry.model import Report, iter_token_columns
from jobrunner.telemetry.report_md import api_table, estimate_table, fmt, time_table, usd
from jobrunner.telemetry.timeline import (
    DEVICE_FILE,
    ROWS_FILE,
    STEPS_FILE,
    read_timeline,
    sample_timeline,
)

CHART_POINTS = 20_000  # records a chart draws at most (a browser draws them all)

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;max-width:1180px;
color:#1d2330;padding:0 16px}
h1{font-size:24px;margin-bottom:2px}.sub{color:#5b6475;margin-top:0}
.tiles{display:grid;grid-template-columns:repeat(4,1fr);gap:12px;margin:18px 0}
.tile{background:#f4f6fa;border-radius:8px;padding:12px 14px}
.tile .v{font-size:22px;font-weight:600}.tile .k{color:#5b6475;font-size:13px}
.chart{margin:8px 0 18px 0;border:1px solid #e6e9ef;border-radius:8px}
table{border-collapse:collapse;margin:8px 0 18px 0;font-size:14px}
td,th{border-bottom:1px solid #e6e9ef;padding:4px 10px;text-align:left}
.grid2{display:grid;grid-template-columns:1fr 1fr;gap:16px}
"""

HOOK = (
    "<script>window.__errors=[];function __rec(m){window.__errors.push(String(m));"
    "if(document.body){document.body.dataset.errors=window.__errors.join(' | ');}}"
    "window.addEventListener('error',function(e){__rec(e.message);});"
    "var __ce=console.error;console.error=function(){__rec([].join.call(arguments,' '));"
    "__ce.apply(console,arguments);};</script>"
)
COUNT = (
    "<script>document.body.dataset.charts=String(document.querySelectorAll('.js-plotly-plot .main-svg').length"
    " ? document.querySelectorAll('.js-plotly-plot').length : 0);"
    "document.body.dataset.errors=window.__errors.join(' | ');</script>"
)


def sample_rows(rundir: RunDir, total: int) -> list[dict[str, Any]]:
    """Every k-th committed row's token columns (succeeded rows), at most about CHART_POINTS."""
    stride = max(1, -(-total // CHART_POINTS))
    rows = itertools.islice(iter_token_columns(rundir), 0, None, stride)
    return [r for r in rows if r["finish_reason"] != "error"]


def to_html(report: Report, rundir: RunDir) -> str:
    # every chart reads at most CHART_POINTS records of a timeline, evenly spread over it
    steps, stride = sample_timeline(rundir.path, STEPS_FILE, CHART_POINTS)
    samples = read_timeline(rundir.path, DEVICE_FILE)
    rows = sample_rows(rundir, report.rows.total)
    row_work = sample_timeline(rundir.path, ROWS_FILE, CHART_POINTS)[0] or rows  # older runs
    figs = [
        charts.cost(report),
        charts.cost_per_row(row_work),
        charts.throughput(steps, stride),
        charts.running(steps),
        charts.device(samples),
        charts.lengths(rows),
    ]
    drawn = [f for f in figs if f is not None]
    chart_html = [_fig_html(f, first=i == 0) for i, f in enumerate(drawn)]
    title = html.escape(f"jobrunner report: {report.job}")
    d = report.device
    sub = html.escape(
        f"model {report.model} on {d.count} x {d.name}, {report.engine}"
        f" engine; {report.rows.succeeded:,} rows succeeded,"
        f" {report.rows.failed:,} failed"
    )
    return "\n".join(
        [
            "<!doctype html><html><head><meta charset='utf-8'>",
            f"<title>{title}</title>",
            f"<style>{CSS}</style>",
            "</head><body>",
            HOOK,
            f"<h1>{title}</h1>",
            f"<p class='sub'>{sub}</p>",
            tiles(report),
            *chart_html,
            "<div class='grid2'>",
            _md_table(time_table(report)),
            _md_table(api_table(report)),
            "</div>",
            _md_table(markdown_lines(report.model_memory)),
            _md_table(estimate_table(report)),
            _notes(report),
            COUNT,
            "</body></html>",
        ]
    )


def _fig_html(fig, first: bool) -> str:
    body = fig.to_html(
        full_html=False, include_plotlyjs=first, config={"displaylogo": False, "responsive": True}
    )
    return f"<div class='chart'>{body}</div>"


def tiles(r: Report) -> str:
    c, tok, tm = r.cost, r.tokens, r.time
    b = tm.breakdown["seconds"]
    busiest = max(b, key=b.get) if any(b.values()) else "n/a"
    share = f" ({b[busiest] / sum(b.values()):.0%})" if any(b.values()) else ""
    without = c.cost_without_savings_usd

    def pct(x: float) -> str:
        return f", {x / without:.1%} of the bill without it" if without else ""

    items = [
        (usd(c.cost_usd), "total cost"),
        (usd(c.usd_per_1m_tokens), "per 1M tokens (in + out)"),
        (usd(c.usd_per_1m_input_tokens), "per 1M input tokens"),
        (usd(c.usd_per_1m_output_tokens), "per 1M output tokens"),
        (
            usd(c.cache_saved_usd),
            f"saved by the prefix cache ({tok.cached:,} tokens{pct(c.cache_saved_usd)})",
        ),
        (
            usd(c.dedup_saved_usd),
            f"saved by dedup ({r.engine_stats['deduplicated']} rows{pct(c.dedup_saved_usd)})",
        ),
        (f"{fmt(tm.wall_seconds, ',.1f')} s", f"wall time; most in {busiest}{share}"),
        (f"{fmt(r.throughput.completion_tokens_per_second, ',.1f')}", "generated tokens/s"),
    ]
    if c.energy_kwh is not None:
        items.append((f"{c.energy_kwh:.4f} kWh", "GPU energy (NVML)"))
    cells = "".join(
        f"<div class='tile'><div class='v'>{html.escape(v)}</div>"
        f"<div class='k'>{html.escape(k)}</div></div>"
        for v, k in items
    )
    return f"<div class='tiles'>{cells}</div>"


def _md_table(lines: list[str]) -> str:
    """Render the Markdown tables of report_md as HTML (one renderer of the figures, two skins)."""
    out, in_table = [], False
    for line in lines:
        if line.startswith("## "):
            out.append(f"<h3>{html.escape(line[3:])}</h3>")
        elif line.startswith("| --- "):
            continue
        elif line.startswith("|"):
            cells = [html.escape(c.strip()) for c in line.strip("|").split("|")]
            tag = "th" if not in_table else "td"
            if not in_table:
                out.append("<table>")
                in_table = True
            out.append("<tr>" + "".join(f"<{tag}>{c}</{tag}>" for c in cells) + "</tr>")
        else:
            if in_table:
                out.append("</table>")
                in_table = False
            if line.strip():
                out.append(f"<p>{html.escape(line)}</p>")
    if in_table:
        out.append("</table>")
    return "<div>" + "\n".join(out) + "</div>"


def _notes(r: Report) -> str:
    c = r.cost
    items = [
        *[f"Price warning: {w}" for w in c.price_warnings],
        f"Device price: ${fmt(c.usd_per_hour, '.4f')}/h: {c.price_source}.",
        "Each row pays for the engine steps it was in, shared by the tokens each row computed"
        " in a step (prefix-cache hits are free), plus a share of the load and idle time by"
        " those tokens; duplicates split one row's cost.",
        *r.notes,
    ]
    return (
        "<h3>Notes</h3><ul>" + "".join(f"<li>{html.escape(str(n))}</li>" for n in items) + "</ul>"
    )
