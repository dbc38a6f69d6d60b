"""The report's charts as plotly figures, built from the run directory's rows and timelines.

Each function returns a figure, or None when there is nothing to draw (e.g. no step log).
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

from jobrunner.telemetry.breakdown import PHASES
from jobrunner.telemetry.model import Report

LAYOUT = {
    "template": "plotly_white",
    "height": 340,
    "margin": {"l": 60, "r": 60, "t": 50, "b": 45},
    "legend": {"orientation": "h", "y": -0.2},
}


def _step_start(r: dict[str, Any]) -> float:
    return r["t"] - (r.get("step_seconds") or 0.0)


def _timed(
    records: list[dict[str, Any]], key: str = "t", start=None
) -> list[tuple[float, dict[str, Any]]]:
    """(seconds since the job's first run started, record); runs are laid end to end."""
    by_run: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        if r.get(key) is not None:
            by_run[int(r.get("run") or 0)].append(r)
    out, offset = [], 0.0
    for run in sorted(by_run):
        rs = sorted(by_run[run], key=lambda r: r[key])
        t0 = min(start(r) for r in rs) if start else rs[0][key]
        out += [(offset + r[key] - t0, r) for r in rs]
        offset += rs[-1][key] - t0 + 1.0
    return out


def throughput(steps: list[dict[str, Any]], stride: int = 1):
    """Tokens/s over time. `stride` > 1: each step stands for that many (a sample of a long
    timeline), and its tokens times `stride` are spread from the previous sampled step on."""
    import plotly.graph_objects as go

    timed = _timed(steps, start=_step_start)
    if not timed:
        return None
    width = max(1.0, timed[-1][0] / 120)
    bins: dict[int, list[float]] = defaultdict(lambda: [0.0, 0.0])
    prev = 0.0
    for t, s in timed:  # a step's tokens are spread over its duration (t marks its end)
        tokens = (
            stride * (s.get("prefill_tokens") or s.get("batch_tokens") or 0),
            stride * (s.get("decode_tokens") or 0),
        )
        start = prev if stride > 1 else max(t - (s.get("step_seconds") or 0.0), 0.0)
        _spread(bins, start, t, width, tokens)
        prev = t
    xs = list(range(min(bins), max(bins) + 1))
    fig = go.Figure(
        [
            go.Scatter(
                x=[x * width for x in xs],
                y=[bins[x][0] / width for x in xs],
                name="prompt tokens/s",
                stackgroup="tok",
            ),
            go.Scatter(
                x=[x * width for x in xs],
                y=[bins[x][1] / width for x in xs],
                name="generated tokens/s",
                stackgroup="tok",
            ),
        ]
    )
    fig.update_layout(
        title="Throughput over time", xaxis_title="seconds", yaxis_title="tokens/s", **LAYOUT
    )
    return fig


def _spread(bins: dict, start: float, end: float, width: float, tokens: tuple) -> None:
    first, last = int(start // width), int(end // width)
    span = max(end - start, 1e-9)
    for b in range(first, last + 1):
        overlap = min(end, (b + 1) * width) - max(start, b * width)
        frac = overlap / span if end > start else 1.0
        for i, n in enumerate(tokens):
            bins[b][i] += n * frac


def running(steps: list[dict[str, Any]], num_kv_blocks: int | None = None):
    import plotly.graph_objects as go

    timed = _timed(steps, start=_step_start)
    if not timed:
        return None
    traces = []
    workers = sorted({s.get("worker") or "" for _, s in timed})
    for w in workers:  # one set of lines per Ray worker; a local run has one, unnamed
        pts = [(t, s) for t, s in timed if (s.get("worker") or "") == w]
        x, who = [t for t, _ in pts], f"{w} " if len(workers) > 1 else ""
        for key, name, style in (
            ("num_running", "running sequences", {"shape": "hv"}),
            ("num_waiting", "waiting sequences", {"shape": "hv"}),
            ("kv_blocks_used", "KV-cache blocks in use", {"dash": "dot", "shape": "hv"}),
        ):
            traces.append(
                go.Scatter(
                    x=x,
                    y=[s.get(key) for _, s in pts],
                    name=f"{who}{name}",
                    line=style,
                    **({"yaxis": "y2"} if key == "kv_blocks_used" else {}),
                )
            )
    fig = go.Figure(traces)
    fig.update_layout(
        title="Running sequences and KV-cache use",
        xaxis_title="seconds",
        yaxis_title="sequences",
        yaxis2={"title": "KV blocks", "overlaying": "y", "side": "right", "rangemode": "tozero"},
        **LAYOUT,
    )
    return fig


def device(samples: list[dict[str, Any]]):
    """GPU utilisation and power when the job had GPUs; else the host CPU and its memory."""
    import plotly.graph_objects as go

    timed = _timed(samples)
    if not timed:
        return None
    gpus = sorted({s["device"] for _, s in timed if s["device"] != "host"})
    traces = []
    for dev in gpus or ["host"]:
        pts = [(t, s) for t, s in timed if s["device"] == dev]
        label = "host CPU" if dev == "host" else dev
        x = [t for t, _ in pts]
        traces.append(go.Scatter(x=x, y=[s["util_percent"] for _, s in pts], name=f"{label} %"))
        key, name = ("power_w", "power (W)") if gpus else ("mem_used_bytes", "resident memory")
        scale = 1.0 if gpus else 2.0**-30  # bytes shown in GiB
        traces.append(
            go.Scatter(
                x=x,
                y=[None if s[key] is None else s[key] * scale for _, s in pts],
                name=f"{label} {name}",
                yaxis="y2",
                line={"dash": "dot"},
            )
        )
    if gpus:  # the host's CPU next to the GPUs, on the same percent axis
        pts = [(t, s) for t, s in timed if s["device"] == "host"]
        traces.append(
            go.Scatter(
                x=[t for t, _ in pts], y=[s["util_percent"] for _, s in pts], name="host CPU %"
            )
        )
    fig = go.Figure(traces)
    fig.update_layout(
        title="GPU utilisation and power" if gpus else "Host CPU utilisation and memory",
        xaxis_title="seconds",
        yaxis={"title": "utilisation %", "range": [0, 105]},
        yaxis2={
            "title": "power (W)" if gpus else "resident memory (GiB)",
            "overlaying": "y",
            "side": "right",
            "rangemode": "tozero",
        },
        **LAYOUT,
    )
    return fig


def cost_per_row(rows: list[dict[str, Any]]):
    """Each row's cost against the tokens the engine computed for it: rows of equal work
    should sit at equal height, so skew shows at a glance."""
    import plotly.graph_objects as go

    pts = [(work_tokens(r), r["cost_usd"]) for r in rows if r.get("cost_usd") is not None]
    pts = [(w, c) for w, c in pts if w > 0 and c > 0]
    if not pts:
        return None
    fig = go.Figure(
        go.Scatter(
            x=[w for w, _ in pts],
            y=[c for _, c in pts],
            mode="markers",
            marker={"size": 6, "opacity": 0.6},
            name="rows",
        )
    )
    fig.update_layout(
        title="Cost per row against its work",
        xaxis={
            "title": "tokens computed for the row (prompt not cached + generated)",
            "type": "log",
        },
        yaxis={"title": "row cost (USD)", "type": "log", **usd_ticks([c for _, c in pts])},
        showlegend=False,
        **LAYOUT,
    )
    return fig


def work_tokens(r: dict[str, Any]) -> float:
    """The engine's work for a row (telemetry/rows.parquet), else its token columns; a
    duplicate's share of its leader's."""
    if r.get("prefill_tokens") is not None:
        work = (r["prefill_tokens"] or 0) + (r.get("decode_tokens") or 0)
    else:
        work = (r["prompt_tokens"] or 0) - (r["cached_tokens"] or 0) + (r["completion_tokens"] or 0)
    return work / max(r.get("shared_with") or 1, 1)


def usd_ticks(values: list[float]) -> dict[str, Any]:
    """Log-axis ticks labelled in dollars ($0.0002, $0.0005, $0.001): at 1, 2 and 5 times each
    power of ten the values span (every power of ten alone past four decades)."""
    vals = [v for v in values if v and v > 0]
    if not vals:
        return {}
    lo, hi = math.floor(math.log10(min(vals))), math.ceil(math.log10(max(vals)))
    steps = (1,) if hi - lo > 4 else (1, 2, 5)
    ticks = [m * 10.0**k for k in range(lo, hi + 1) for m in steps]
    ticks = [t for t in ticks if min(vals) / 2 <= t <= max(vals) * 2] or ticks
    return {"tickvals": ticks, "ticktext": [_usd_label(t) for t in ticks]}


def _usd_label(x: float) -> str:
    return f"${x:,.0f}" if x >= 1 else f"${x:.{max(0, math.ceil(-math.log10(x) - 1e-9))}f}"


def lengths(rows: list[dict[str, Any]]):
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    if not rows:
        return None
    fig = make_subplots(rows=1, cols=2, subplot_titles=("prompt tokens", "completion tokens"))
    fig.add_trace(
        go.Histogram(x=[r["prompt_tokens"] for r in rows], name="prompt", nbinsx=40), 1, 1
    )
    fig.add_trace(
        go.Histogram(x=[r["completion_tokens"] for r in rows], name="completion", nbinsx=40), 1, 2
    )
    fig.update_layout(title="Prompt and completion lengths (rows)", showlegend=False, **LAYOUT)
    return fig


def cost(report: Report):
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    b, c = report.time.breakdown, report.cost
    phases = [p for p in PHASES if b["seconds"][p] > 0]
    fig = make_subplots(
        rows=1,
        cols=2,
        column_widths=[0.45, 0.55],
        subplot_titles=("where the money went (USD)", "ours vs hosted batch APIs (USD)"),
    )
    fig.add_trace(go.Bar(x=phases, y=[b["usd"][p] for p in phases], name="spent"), 1, 1)
    fig.add_trace(
        go.Bar(
            x=["cache saved", "dedup saved"],
            y=[c.cache_saved_usd, c.dedup_saved_usd],
            name="saved",
        ),
        1,
        1,
    )
    apis = report.api_equivalent
    fig.add_trace(
        go.Bar(
            x=["this job", *[a["model"] for a in apis]],
            y=[c.cost_usd, *[a["usd"] for a in apis]],
            name="same tokens",
        ),
        1,
        2,
    )
    fig.update_layout(title="Cost breakdown", **{**LAYOUT, "height": 380})
    values = [c.cost_usd, *[a["usd"] for a in apis]]
    fig.update_yaxes(type="log", row=1, col=2, **usd_ticks(values))
    return fig
