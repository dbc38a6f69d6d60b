"""metrics.prom: the job's figures in Prometheus text format, and a push to a Pushgateway.

Names follow vLLM's (`vllm:prompt_tokens_total` -> `jobrunner_prompt_tokens_total`,
`vllm:time_to_first_token_seconds`, ...) where vLLM has one, and Prometheus's conventions: base
units in the name, `_total` on counters, help text on each. Per-row latencies and step times are
histograms (from telemetry/rows.parquet and steps.parquet). The file suits node_exporter's
textfile collector. Every series carries a `job_name` label (the job file's `name`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jobrunner.telemetry.model import load_report
from jobrunner.telemetry.timeline import ROWS_FILE, STEPS_FILE, read_timeline

# Latency buckets in seconds: a CPU row waits seconds to minutes for its first token, a GPU row
# milliseconds; a decode step is milliseconds to a second.
TTFT_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)
STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


def build_registry(
    report: dict[str, Any],
    steps: list[dict[str, Any]] | None = None,
    rows: list[dict[str, Any]] | None = None,
):
    """The job's metrics: `_total` counters, base units (seconds, joules) in the names."""
    import prometheus_client
    from prometheus_client import CollectorRegistry, Counter, Gauge

    prometheus_client.disable_created_metrics()  # a finished job: *_created adds nothing
    reg = CollectorRegistry()
    job = str(report.get("job") or "job")

    def counter(name: str, doc: str, value: float | None) -> None:
        if value is not None:
            Counter(name, doc, ["job_name"], registry=reg).labels(job).inc(value)

    def gauge(name: str, doc: str, value: float | None) -> None:
        if value is not None:
            Gauge(name, doc, ["job_name"], registry=reg).labels(job).set(value)

    tok, cost = report["tokens"], report["cost"]
    counter("jobrunner_prompt_tokens", "Prompt tokens of the finished rows.", tok["prompt"])
    counter(
        "jobrunner_prompt_tokens_cached",
        "Prompt tokens served from the prefix cache.",
        tok["cached"],
    )
    counter("jobrunner_generation_tokens", "Generated (completion) tokens.", tok["completion"])
    c = Counter(
        "jobrunner_request_success",
        "Finished rows by finish reason.",
        ["job_name", "finished_reason"],
        registry=reg,
    )
    for reason, n in sorted(report["finish_reasons"].items()):
        c.labels(job, str(reason)).inc(n)
    counter(
        "jobrunner_request_failure",
        "Rows that failed (see errors.jsonl).",
        report["rows"]["failed"],
    )
    counter(
        "jobrunner_num_preemptions",
        "Sequences preempted to free KV-cache blocks.",
        report["engine_stats"]["preemptions"],
    )
    counter(
        "jobrunner_cost_usd",
        "What the job cost in US dollars: the device time at its price (sum of the rows).",
        cost["cost_usd"],
    )
    counter(
        "jobrunner_cost_saved_usd",
        "US dollars the prefix cache and deduplication saved, at the price paid.",
        cost["cache_saved_usd"] + cost["dedup_saved_usd"],
    )
    energy = cost["energy_kwh"]
    counter(
        "jobrunner_energy_joules",
        "GPU energy (NVML's energy counter), in joules.",
        None if energy is None else energy * 3.6e6,
    )
    gauge(
        "jobrunner_duration_seconds",
        "Wall time of the job, summed over its runs.",
        report["time"]["wall_seconds"],
    )
    gauge(
        "jobrunner_last_success_timestamp_seconds",
        "When the job last finished every row (Unix time).",
        report.get("finished_at"),
    )
    _latency_histograms(reg, job, steps or [], rows or [])
    return reg


def _latency_histograms(reg, job: str, steps: list[dict], rows: list[dict]) -> None:
    from prometheus_client import Histogram

    def histogram(name: str, doc: str, values: list[float], buckets) -> None:
        h = Histogram(name, doc, ["job_name"], buckets=buckets, registry=reg).labels(job)
        for v in values:
            h.observe(v)

    histogram(
        "jobrunner_time_to_first_token_seconds",
        "Per row: from entering the engine to its first generated token.",
        [r["first_token_seconds"] for r in rows if r.get("first_token_seconds") is not None],
        TTFT_BUCKETS,
    )
    histogram(
        "jobrunner_time_per_output_token_seconds",
        "Per row: decode time per generated token after the first.",
        tpot(rows),
        STEP_BUCKETS,
    )
    histogram(
        "jobrunner_step_duration_seconds",
        "Per engine step (a forward pass over prompt chunks and decode rows), in seconds.",
        [s["step_seconds"] for s in steps if s.get("step_seconds") is not None],
        STEP_BUCKETS,
    )


def tpot(rows: list[dict[str, Any]]) -> list[float]:
    """Each row's decode seconds over its tokens after the first (rows with two or more)."""
    return [
        r["decode_seconds"] / (r["completion_tokens"] - 1)
        for r in rows
        if r.get("decode_seconds") is not None and (r.get("completion_tokens") or 0) > 1
    ]


def write_metrics(report: dict[str, Any], path: Path) -> None:
    from prometheus_client import write_to_textfile

    steps, rows = read_timeline(path.parent, STEPS_FILE), read_timeline(path.parent, ROWS_FILE)
    write_to_textfile(str(path), build_registry(report, steps, rows))


def push_metrics(run_path: str | Path, url: str) -> None:
    """Push the run directory's metrics (from report.json) to a Pushgateway at `url`."""
    from prometheus_client import push_to_gateway

    report = load_report(run_path)
    steps, rows = read_timeline(run_path, STEPS_FILE), read_timeline(run_path, ROWS_FILE)
    reg = build_registry(report, steps, rows)
    push_to_gateway(
        url,
        job="jobrunner",
        grouping_key={"job_name": str(report.get("job") or "job")},
        registry=reg,
        timeout=10,
    )
