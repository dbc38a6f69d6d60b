"""The job report as a typed model (report.json is its `to_json`), and the per-row columns the
report reads from shards.

Sections with fixed fields are dataclasses that the writers (report.md, report.html,
metrics.prom) read by attribute; figures keyed by data (finish reasons, phases, engine counters,
API prices, workers) stay plain JSON. `Report.from_json` reads a report.json of any version:
a field it lacks is None (or empty), a field it does not know is dropped.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobrunner.io.rundir import RunDir, read_committed

REPORT_FILE = "report.json"
TOKEN_COLUMNS = ["prompt_tokens", "cached_tokens", "completion_tokens", "cost_usd", "finish_reason"]


@dataclass
class Rows:
    succeeded: int = 0
    failed: int = 0
    skipped: int = 0  # committed before the latest run started
    total: int = 0  # succeeded + failed


@dataclass
class Tokens:
    prompt: int = 0
    cached: int = 0  # prompt tokens served from the prefix cache
    computed_prompt: int = 0  # prompt - cached - duplicate rows' prompts
    completion: int = 0
    total: int = 0  # prompt + completion


@dataclass
class Time:
    wall_seconds: float = 0.0  # summed over the job's runs, as the engine, forward, load ones
    engine_seconds: float = 0.0
    forward_seconds: float = 0.0
    load_seconds: float = 0.0
    engine_busy_fraction: float | None = None  # forward / wall
    busy_fraction_after_load: float | None = None  # forward / (wall - load)
    forward_fraction_of_engine: float | None = None
    breakdown: dict[str, dict[str, float]] = field(default_factory=dict)  # seconds/usd by phase


@dataclass
class Throughput:
    completion_tokens_per_second: float | None = None
    total_tokens_per_second: float | None = None
    rows_per_second: float | None = None


@dataclass
class Device:
    name: str | None = None
    kind: str | None = None  # cuda | cpu | mps
    count: int | None = None
    device_hours: float = 0.0  # GPU-hours on GPUs, vCPU-hours on CPUs (unit_hours)
    unit_hours: str | None = None
    gpu_hours: float = 0.0


@dataclass
class Cost:
    cost_usd: float = 0.0  # the committed rows' cost plus retried attempts
    retried_attempts_usd: float = 0.0
    usd_per_hour: float | None = None
    price_source: str | None = None
    price_unit: str | None = None
    price_date: str | None = None
    usd_per_1m_input_tokens: float | None = None
    usd_per_1m_output_tokens: float | None = None
    usd_per_1m_tokens: float | None = None
    cache_saved_usd: float = 0.0
    dedup_saved_usd: float = 0.0
    cost_without_savings_usd: float = 0.0
    energy_kwh: float | None = None
    price_warnings: list[str] = field(default_factory=list)


@dataclass
class Telemetry:
    """Means and peaks of the sampled timelines (None where nothing was measured)."""

    samples: int = 0
    gpu_util_mean_percent: float | None = None
    gpu_power_mean_w: float | None = None
    gpu_mem_peak_bytes: float | None = None
    host_cpu_mean_percent: float | None = None
    host_rss_peak_bytes: float | None = None
    kv_blocks_peak: int | None = None
    running_peak: int | None = None


@dataclass
class Report:
    job: str | None = None
    model: str | None = None
    engine: str | None = None
    rows: Rows = field(default_factory=Rows)
    finish_reasons: dict[str, int] = field(default_factory=dict)
    tokens: Tokens = field(default_factory=Tokens)
    time: Time = field(default_factory=Time)
    throughput: Throughput = field(default_factory=Throughput)
    device: Device = field(default_factory=Device)
    cost: Cost = field(default_factory=Cost)
    api_equivalent: list[dict[str, Any]] = field(default_factory=list)  # prices.api_equivalent
    telemetry: Telemetry = field(default_factory=Telemetry)
    model_memory: dict[str, Any] | None = None  # quant_check.report_section
    engine_stats: dict[str, int] = field(default_factory=dict)  # record.ENGINE_COUNTERS, summed
    notes: list[str] = field(default_factory=list)
    runs: int = 0
    workers: list[dict[str, Any]] = field(default_factory=list)  # executor ray: per worker
    finished_at: float | None = None
    estimate: dict[str, Any] | None = None  # report.compare_estimate

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Report:
        return _typed(cls, d)


def _typed(cls: type, d: dict[str, Any]) -> Any:
    kinds = {f.name: f.type for f in dataclasses.fields(cls)}
    sections = {c.__name__: c for c in (Rows, Tokens, Time, Throughput, Device, Cost, Telemetry)}
    kept = {}
    for k, v in d.items():
        if k not in kinds:
            continue
        section = sections.get(kinds[k])
        kept[k] = _typed(section, v or {}) if section else v
    return cls(**kept)


def iter_token_columns(rundir: RunDir) -> Iterator[dict[str, Any]]:
    """Each committed row's TOKEN_COLUMNS (None where a JSONL shard lacks one); shards may be
    local files or store URLs."""
    for f in rundir.shard_files():
        yield from read_committed(f, TOKEN_COLUMNS)


def load_report(path: str | Path) -> Report:
    return Report.from_json(json.loads((Path(path) / REPORT_FILE).read_text(encoding="utf-8")))
