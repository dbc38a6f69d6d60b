"""metrics.prom: the job's figures in Prometheus text format, and a push to a Pushgateway.

Names follow vLLM's (`vllm:prompt_tokens_total` -> `jobrunner_prompt_tokens_total`,
`vllm:time_to_first_token_seconds`, ...) where vLLM has one, and Prometheus's conventions: base
units in the name, `_total` on counters, help text on each. Per-row latencies and step times are
histograms (from telemetry/rows.parquet and steps.parquet). The file suits node_exporter's
textfile collector. Every series carries a `job_name` label (the job file's `name`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from jobrunner.telemetry.model import Report, load_report
from jobrunner.telemetry.timeline import ROWS_FILE, STEPS_FILE, column_floats, timeline_batches

# Latency buckets in seconds: a CPU row waits seconds to minutes for its first token, a GPU row
# milliseconds; a decode step is milliseconds to a second.
TTFT_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)
STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


def build_registry(report: Report, run_path: str | Path | None = None):
    """The job's metrics: `_total` counters, base units (seconds, joules) in the names; the
    latency histograms from the run directory's timelines when `run_path` is given."""
    import prometheus_client
    from prometheus_client import CollectorRegistry, Counter, Gauge

    prometheus_client.disable_created_metrics()  # a finished job: *_created adds nothing
    reg = CollectorRegistry()
    job = str(report.job or "job")

    def counter(name: str, doc: str, value: float | None) -> None:
        if value is not None:
            Counter(name, doc, ["job_name"], registry=reg).labels(job).inc(value)

    def gauge(name: str, doc: str, value: float | None) -> None:
        if value is not None:
            Gauge(name, doc, ["job_name"], registry=reg).labels(job).set(value)

    tok, cost = report.tokens, report.cost
    counter("jobrunner_prompt_tokens", "Prompt tokens of the finished rows.", tok.prompt)
    counter(
        "jobrunner_prompt_tokens_cached",
        "Prompt tokens served from the prefix cache.",
        tok.cached,
    )
    counter("jobrunner_generation_tokens", "Generated (completion) tokens.", tok.completion)
    c = Counter(
        "jobrunner_request_success",
        "Finished rows by finish reason.",
        ["job_name", "finished_reason"],
        registry=reg,
    )
    for reason, n in sorted(report.finish_reasons.items()):
        c.labels(job, str(reason)).inc(n)
    counter(
        "jobrunner_request_failure",
        "Rows that failed (see errors.jsonl).",
        report.rows.failed,
    )
    counter(
        "jobrunner_num_preemptions",
        "Sequences preempted to free KV-cache blocks.",
        report.engine_stats.get("preemptions", 0),
    )
    counter(
        "jobrunner_cost_usd",
        "What the job cost in US dollars: the device time at its price (sum of the rows).",
        cost.cost_usd,
    )
    counter(
        "jobrunner_cost_saved_usd",
        "US dollars the prefix cache and deduplication saved, at the price paid.",
        cost.cache_saved_usd + cost.dedup_saved_usd,
    )
    energy = cost.energy_kwh
    counter(
        "jobrunner_energy_joules",
        "GPU energy (NVML's energy counter), in joules.",
        None if energy is None else energy * 3.6e6,
    )
    gauge(
        "jobrunner_duration_seconds",
        "Wall time of the job, summed over its runs.",
        report.time.wall_seconds,
    )
    gauge(
        "jobrunner_last_success_timestamp_seconds",
        "When the job last finished every row (Unix time).",
        report.finished_at,
    )
    if run_path is not None:
        reg.register(LatencyHistograms(job, Path(run_path)))
    return reg


class LatencyHistograms:
    """Per-row latencies and step times as histograms, counted batch by batch over
    telemetry/rows.parquet and steps.parquet (vectorized: a job of 100M rows is never a list)."""

    SPECS = (
        (
            "jobrunner_time_to_first_token_seconds",
            "Per row: from entering the engine to its first generated token.",
            ROWS_FILE,
            TTFT_BUCKETS,
        ),
        (
            "jobrunner_time_per_output_token_seconds",
            "Per row: decode time per generated token after the first.",
            ROWS_FILE,
            STEP_BUCKETS,
        ),
        (
            "jobrunner_step_duration_seconds",
            "Per engine step (a forward pass over prompt chunks and decode rows), in seconds.",
            STEPS_FILE,
            STEP_BUCKETS,
        ),
    )

    def __init__(self, job: str, run_path: Path) -> None:
        self.job, self.run_path = job, run_path

    def collect(self):
        from prometheus_client.core import HistogramMetricFamily

        for name, doc, file, buckets in self.SPECS:
            counts, total = np.zeros(len(buckets) + 1, dtype=np.int64), 0.0
            for batch in timeline_batches(self.run_path, file):
                v = _VALUES[name](batch)
                v = v[~np.isnan(v)]
                counts += np.bincount(np.searchsorted(buckets, v), minlength=len(counts))
                total += float(v.sum())
            cumulative = np.cumsum(counts)
            edges = [*(_le(b) for b in buckets), "+Inf"]
            family = HistogramMetricFamily(name, doc, labels=["job_name"])
            family.add_metric([self.job], list(zip(edges, cumulative.tolist(), strict=True)), total)
            yield family


def _le(b: float) -> str:
    from prometheus_client.utils import floatToGoString

    return floatToGoString(b)


def tpot(batch) -> np.ndarray:
    """Each row's decode seconds over its tokens after the first (rows with two or more)."""
    tokens = column_floats(batch, "completion_tokens")
    return np.where(
        tokens > 1, column_floats(batch, "decode_seconds") / np.maximum(tokens - 1, 1), np.nan
    )


_VALUES = {
    "jobrunner_time_to_first_token_seconds": lambda b: column_floats(b, "first_token_seconds"),
    "jobrunner_time_per_output_token_seconds": tpot,
    "jobrunner_step_duration_seconds": lambda b: column_floats(b, "step_seconds"),
}


def write_metrics(report: Report, path: Path) -> None:
    from prometheus_client import write_to_textfile

    write_to_textfile(str(path), build_registry(report, path.parent))


def push_metrics(run_path: str | Path, url: str) -> None:
    """Push the run directory's metrics (from report.json) to a Pushgateway at `url`."""
    from prometheus_client import push_to_gateway

    report = load_report(run_path)
    reg = build_registry(report, run_path)
    push_to_gateway(
        url,
        job="jobrunner",
        grouping_key={"job_name": str(report.job or "job")},
        registry=reg,
        timeout=10,
    )
