"""metrics.prom: the job's figures in Prometheus text format, and a push to a Pushgateway.

Names follow vLLM's (`vllm:prompt_tokens_total` -> `jobrunner_prompt_tokens_total`, ...) where
vLLM has one, so dashboards carry over; the file suits node_exporter's textfile collector.
Every series carries a `job_name` label (the job file's `name`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jobrunner.telemetry.model import load_report
from jobrunner.telemetry.timeline import STEPS_FILE, read_timeline


def build_registry(report: dict[str, Any], steps: list[dict[str, Any]] | None = None):
    import prometheus_client
    from prometheus_client import CollectorRegistry, Counter, Gauge

    prometheus_client.disable_created_metrics()  # a finished job: *_created adds nothing
    reg = CollectorRegistry()
    job = str(report.get("job") or "job")

    def counter(name: str, doc: str, value: float, **labels: str) -> None:
        c = Counter(name, doc, ["job_name", *labels], registry=reg)
        c.labels(job, *labels.values()).inc(value)

    def gauge(name: str, doc: str, value: float | None) -> None:
        if value is not None:
            Gauge(name, doc, ["job_name"], registry=reg).labels(job).set(value)

    tok = report["tokens"]
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
    gauge(
        "jobrunner_time_per_output_token_seconds",
        "Mean time between a sequence's generated tokens (decode step time).",
        tpot(steps or []),
    )
    gauge(
        "jobrunner_cost_usd",
        "What the job cost in USD (device time at the device-hour price).",
        report["cost"]["cost_usd"],
    )
    gauge(
        "jobrunner_cost_saved_usd",
        "USD saved by the prefix cache and deduplication.",
        report["cost"]["cache_saved_usd"] + report["cost"]["dedup_saved_usd"],
    )
    gauge(
        "jobrunner_duration_seconds",
        "Wall time of the job, summed over its runs.",
        report["time"]["wall_seconds"],
    )
    gauge("jobrunner_energy_kwh", "GPU energy (NVML counter).", report["cost"]["energy_kwh"])
    gauge(
        "jobrunner_last_success_timestamp_seconds",
        "When the job last finished every row.",
        report.get("finished_at"),
    )
    return reg


def tpot(steps: list[dict[str, Any]]) -> float | None:
    """Each running sequence gets one token per decode step: the mean decode step time."""
    dec = [s["step_seconds"] or 0.0 for s in steps if (s.get("decode_tokens") or 0) > 0]
    return sum(dec) / len(dec) if dec else None


def write_metrics(report: dict[str, Any], path: Path) -> None:
    from prometheus_client import write_to_textfile

    write_to_textfile(str(path), build_registry(report, read_timeline(path.parent, STEPS_FILE)))


def push_metrics(run_path: str | Path, url: str) -> None:
    """Push the run directory's metrics (from report.json) to a Pushgateway at `url`."""
    from prometheus_client import push_to_gateway

    report = load_report(run_path)
    reg = build_registry(report, read_timeline(run_path, STEPS_FILE))
    push_to_gateway(
        url,
        job="jobrunner",
        grouping_key={"job_name": str(report.get("job") or "job")},
        registry=reg,
        timeout=10,
    )
