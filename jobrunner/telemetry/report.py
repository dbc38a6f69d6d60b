"""The job report, rebuilt from the run directory alone (no model, no GPU).

Totals are sums over the committed rows, so they always agree with the results; time, device
and engine figures come from the per-invocation records in the manifest (`runs`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from jobrunner.io.rundir import RunDir
from jobrunner.io.writers import write_text_atomic
from jobrunner.telemetry.cost import per_million

TOKEN_COLUMNS = ["prompt_tokens", "cached_tokens", "completion_tokens", "cost_usd", "finish_reason"]


def row_totals(rundir: RunDir) -> dict[str, Any]:
    t = {"rows": 0, "prompt_tokens": 0, "cached_tokens": 0, "completion_tokens": 0, "cost_usd": 0.0,
         "finish_reasons": {}}
    for rec in iter_token_columns(rundir):
        t["rows"] += 1
        for k in ("prompt_tokens", "cached_tokens", "completion_tokens", "cost_usd"):
            t[k] += rec[k] or 0
        fr = t["finish_reasons"]
        fr[rec["finish_reason"]] = fr.get(rec["finish_reason"], 0) + 1
    return t


def iter_token_columns(rundir: RunDir):
    import pyarrow.parquet as pq

    for f in rundir.shard_files():
        if f.suffix == ".parquet":
            yield from pq.read_table(f, columns=TOKEN_COLUMNS).to_pylist()
        else:
            with open(f, encoding="utf-8") as fh:
                for line in fh:
                    if line.strip():
                        rec = json.loads(line)
                        yield {k: rec.get(k) for k in TOKEN_COLUMNS}


def build_report(rundir: RunDir) -> dict[str, Any]:
    m = rundir.load_manifest()
    runs = m.runs if m else []
    t = row_totals(rundir)
    failed = sum(1 for _ in rundir.iter_errors())
    ok = t["rows"] - t["finish_reasons"].get("error", 0)
    wall = sum(r.get("wall_seconds", 0.0) for r in runs)
    engine = sum(r.get("engine_seconds", 0.0) for r in runs)
    forward = sum(r.get("forward_seconds", 0.0) for r in runs)
    last = runs[-1] if runs else {}
    device_hours = sum(r.get("wall_seconds", 0.0) * r.get("device_count", 1) for r in runs) / 3600
    tokens = t["prompt_tokens"] + t["completion_tokens"]
    return {
        "job": last.get("job"),
        "model": last.get("model"),
        "engine": last.get("engine"),
        "rows": {"succeeded": ok, "failed": failed, "skipped": sum(r.get("skipped", 0) for r in runs),
                 "total": ok + failed},
        "finish_reasons": t["finish_reasons"],
        "tokens": {"prompt": t["prompt_tokens"], "cached": t["cached_tokens"],
                   "computed_prompt": t["prompt_tokens"] - t["cached_tokens"],
                   "completion": t["completion_tokens"], "total": tokens},
        "time": {"wall_seconds": wall, "engine_seconds": engine, "forward_seconds": forward,
                 "load_seconds": sum(r.get("load_seconds", 0.0) for r in runs),
                 "engine_busy_fraction": forward / wall if wall else None,
                 "forward_fraction_of_engine": forward / engine if engine else None},
        "throughput": {"completion_tokens_per_second": t["completion_tokens"] / wall if wall else None,
                       "total_tokens_per_second": tokens / wall if wall else None,
                       "rows_per_second": t["rows"] / wall if wall else None},
        "device": {"name": last.get("device_name"), "kind": last.get("device_kind"),
                   "count": last.get("device_count"), "device_hours": device_hours,
                   "gpu_hours": device_hours if last.get("device_kind") == "cuda" else 0.0},
        "cost": {"cost_usd": t["cost_usd"], "usd_per_hour": last.get("usd_per_hour"),
                 "price_source": last.get("price_source"),
                 "usd_per_1m_input_tokens": per_million(t["cost_usd"], t["prompt_tokens"]),
                 "usd_per_1m_output_tokens": per_million(t["cost_usd"], t["completion_tokens"]),
                 "usd_per_1m_tokens": per_million(t["cost_usd"], tokens)},
        "engine_stats": {k: sum(r.get(k, 0) for r in runs)
                         for k in ("steps", "preemptions", "oom_retries", "deduplicated")},
        "notes": [n for r in runs for n in r.get("notes", [])],
        "runs": len(runs),
    }


def write_reports(rundir: RunDir) -> dict[str, Any]:
    report = build_report(rundir)
    write_text_atomic(rundir.path / "report.json", json.dumps(report, indent=2, sort_keys=True))
    write_text_atomic(rundir.path / "report.md", to_markdown(report))
    return report


def _fmt(x: Any, spec: str = ",.2f") -> str:
    return "n/a" if x is None else format(x, spec)


def to_markdown(r: dict[str, Any]) -> str:
    rows, tok, tm, c, d = r["rows"], r["tokens"], r["time"], r["cost"], r["device"]
    lines = [
        f"# Job report: {r['job']}",
        "",
        f"Model `{r['model']}` on {d['count']} x {d['name']} ({r['engine']} engine).",
        "",
        "| what | value |",
        "| --- | --- |",
        f"| rows succeeded / failed / skipped | {rows['succeeded']} / {rows['failed']} / {rows['skipped']} |",
        f"| prompt tokens (cached) | {tok['prompt']:,} ({tok['cached']:,}) |",
        f"| completion tokens | {tok['completion']:,} |",
        f"| wall / engine / forward seconds | {_fmt(tm['wall_seconds'], '.1f')} / {_fmt(tm['engine_seconds'], '.1f')} / {_fmt(tm['forward_seconds'], '.1f')} |",
        f"| completion tokens/s | {_fmt(r['throughput']['completion_tokens_per_second'], ',.1f')} |",
        f"| device-hours | {_fmt(d['device_hours'], '.4f')} |",
        f"| cost | ${_fmt(c['cost_usd'], ',.6f')} at ${_fmt(c['usd_per_hour'], '.3f')}/h ({c['price_source']}) |",
        f"| $ per 1M input tokens | ${_fmt(c['usd_per_1m_input_tokens'], ',.4f')} |",
        f"| $ per 1M output tokens | ${_fmt(c['usd_per_1m_output_tokens'], ',.4f')} |",
        "",
    ]
    if r["notes"]:
        lines += ["Notes:", *[f"- {n}" for n in r["notes"]], ""]
    return "\n".join(lines)


def load_report(path: str | Path) -> dict[str, Any]:
    return json.loads((Path(path) / "report.json").read_text(encoding="utf-8"))
