"""The report's charts as plotly figures, built from the run directory's rows and timelines.

Each function returns a figure, or None when there is nothing to draw (e.g. no step log).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from jobrunner.telemetry.breakdown import PHASES

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


def throughput(steps: list[dict[str, Any]]):
    import plotly.graph_objects as go

    timed = _timed(steps, start=_step_start)
    if not timed:
        return None
    width = max(1.0, timed[-1][0] / 120)
    bins: dict[int, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for t, s in timed:  # a step's tokens are spread over its duration (t marks its end)
        tokens = (
            s.get("prefill_tokens") or s.get("batch_tokens") or 0,
            s.get("decode_tokens") or 0,
        )
        _spread(bins, max(t - (s.get("step_seconds") or 0.0), 0.0), t, width, tokens)
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
    x = [t for t, _ in timed]
    fig = go.Figure(
        [
            go.Scatter(
                x=x,
                y=[s.get("num_running") for _, s in timed],
                name="running sequences",
                line={"shape": "hv"},
            ),
            go.Scatter(
                x=x,
                y=[s.get("num_waiting") for _, s in timed],
                name="waiting sequences",
                line={"shape": "hv"},
            ),
            go.Scatter(
                x=x,
                y=[s.get("kv_blocks_used") for _, s in timed],
                name="KV-cache blocks in use",
                yaxis="y2",
                line={"dash": "dot", "shape": "hv"},
            ),
        ]
    )
    fig.update_layout(
        title="Running sequences and KV-cache use",
        xaxis_title="seconds",
        yaxis_title="sequences",
        yaxis2={"title": "KV blocks", "overlaying": "y", "side": "right", "rangemode": "tozero"},
        **LAYOUT,
    )
    return fig


def device(samples: list[dict[str, Any]]):
    import plotly.graph_objects as go

    timed = _timed(samples)
    if not timed:
        return None
    traces = []
    for dev in sorted({s["device"] for _, s in timed}):
        pts = [(t, s) for t, s in timed if s["device"] == dev]
        label = "host CPU" if dev == "host" else dev
        traces.append(
            go.Scatter(
                x=[t for t, _ in pts],
                y=[s["util_percent"] for _, s in pts],
                name=f"{label} utilisation %",
            )
        )
        second = ("power_w", "W") if dev != "host" else ("mem_used_bytes", "RSS bytes")
        traces.append(
            go.Scatter(
                x=[t for t, _ in pts],
                y=[s[second[0]] for _, s in pts],
                name=f"{label} {second[1]}",
                yaxis="y2",
                line={"dash": "dot"},
            )
        )
    fig = go.Figure(traces)
    fig.update_layout(
        title="Device utilisation and power (GPU) / memory (host)",
        xaxis_title="seconds",
        yaxis={"title": "utilisation %", "range": [0, 105]},
        yaxis2={"title": "W or bytes", "overlaying": "y", "side": "right", "rangemode": "tozero"},
        **LAYOUT,
    )
    return fig


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


def cost(report: dict[str, Any]):
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    b, c = report["time"]["breakdown"], report["cost"]
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
            y=[c["cache_saved_usd"], c["dedup_saved_usd"]],
            name="saved",
        ),
        1,
        1,
    )
    apis = report["api_equivalent"]
    fig.add_trace(
        go.Bar(
            x=["this job", *[a["model"] for a in apis]],
            y=[c["cost_usd"], *[a["usd"] for a in apis]],
            name="same tokens",
        ),
        1,
        2,
    )
    fig.update_layout(title="Cost breakdown", **{**LAYOUT, "height": 380})
    fig.update_yaxes(type="log", row=1, col=2)
    return fig
