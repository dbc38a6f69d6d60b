"""RunRecord: one invocation of a job, as manifest.json's `runs` keeps it; the report sums them.

Built in one place for every executor (`RunRecord.of_engine` for an engine that ran here, a
worker's own record the same way), and merged over Ray workers with `RunRecord.merge`. Fields a
record does not name (added by a newer version) are kept in `extra` and written back.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any

from jobrunner.telemetry.prices import run_price_fields

# counters each run record carries and the report sums over runs (and Ray sums over workers)
ENGINE_COUNTERS = (
    "steps",
    "preemptions",
    "oom_retries",
    "draft_tokens",
    "accepted_draft_tokens",
    "deduplicated",
)
SAVINGS = ("cache_saved_usd", "dedup_saved_usd", "dedup_prompt_tokens")


@dataclass
class RunRecord:
    job: str = ""
    model: str = ""
    engine: str = ""
    executor: str = "local"
    wall_seconds: float = 0.0
    load_seconds: float = 0.0
    load_parts: dict[str, float] = field(default_factory=dict)  # engine/start.py LOAD_PARTS
    before_load_seconds: float | None = None  # process start to the load (local runs)
    engine_seconds: float = 0.0  # Ray: the mean per worker, so busy fractions stay per device
    forward_seconds: float = 0.0
    steps: int = 0
    preemptions: int = 0
    oom_retries: int = 0
    draft_tokens: int = 0
    accepted_draft_tokens: int = 0
    deduplicated: int = 0
    skipped: int = 0
    device_name: str | None = None
    device_kind: str | None = None
    device_count: int = 1  # Ray: the whole pool's
    usd_per_hour: float = 0.0  # Ray: the whole pool's
    price_source: str = ""
    price_unit: str | None = None  # what usd_per_hour buys: GPU-hour, vCPU-hour
    price_date: str | None = None  # when that price was read
    api_prices: list[dict[str, Any]] | None = None  # hosted-API prices a price file set
    notes: list[str] = field(default_factory=list)
    cache_saved_usd: float = 0.0
    dedup_saved_usd: float = 0.0
    dedup_prompt_tokens: float = 0.0  # prompt tokens of duplicate rows (not computed)
    energy_kwh: float | None = None
    sample_interval_s: float | None = None
    weights: dict[str, Any] = field(default_factory=dict)  # quantization, quality, KV cache
    workers: list[dict[str, Any]] = field(default_factory=list)  # Ray: one record per worker
    finished_at: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of_engine(cls, cfg: Any, started: Any, device: Any, rate: Any, **fields: Any) -> RunRecord:
        """The record of an engine from `start_engine` (`started`: its kind, counters, load
        time and weights) running `cfg` on `device` at `rate`; `fields` it does not name go to
        `extra`."""
        engine = started.engine
        st = engine.stats
        fields = {**run_price_fields(rate, cfg.cost), **fields}
        names = {f.name for f in dataclasses.fields(cls)}
        extra = {k: fields.pop(k) for k in list(fields) if k not in names}
        return cls(
            job=cfg.name,
            model=cfg.model.source,
            engine=engine.kind,
            load_seconds=started.load_seconds,
            load_parts=dict(started.load_parts),
            usd_per_hour=rate.usd_per_hour,
            price_source=rate.label,
            engine_seconds=st.engine_seconds,
            forward_seconds=st.forward_seconds,
            **{k: getattr(st, k) for k in ENGINE_COUNTERS if k != "deduplicated"},
            device_name=device.name,
            device_kind=device.kind,
            device_count=device.count,
            notes=list(st.notes),
            weights={
                **started.weights,
                "kv_bytes_per_token": st.kv_bytes_per_token,
                "num_kv_blocks": st.num_kv_blocks,
            },
            finished_at=time.time(),
            extra=extra,
            **fields,
        )

    @classmethod
    def merge(cls, records: list[RunRecord], **fields: Any) -> RunRecord:
        """One record for a pool of workers: counters and savings summed, busy seconds the mean
        per worker, load the slowest (and its parts), devices and prices the pool's, notes
        once each."""
        n = len(records) or 1
        first = records[0] if records else cls()
        slowest = max(records, key=lambda w: w.load_seconds, default=first)
        merged = cls(
            job=first.job,
            model=first.model,
            engine=first.engine,
            load_seconds=slowest.load_seconds,
            load_parts=slowest.load_parts,
            engine_seconds=sum(w.engine_seconds for w in records) / n,
            forward_seconds=sum(w.forward_seconds for w in records) / n,
            **{k: sum(getattr(w, k) for w in records) for k in (*ENGINE_COUNTERS, *SAVINGS)},
            device_name=first.device_name,
            device_kind=first.device_kind,
            device_count=sum(w.device_count for w in records),
            usd_per_hour=sum(w.usd_per_hour for w in records),
            price_source=first.price_source,
            price_unit=first.price_unit,
            price_date=first.price_date,
            api_prices=first.api_prices,
            notes=sorted({x for w in records for x in w.notes}),
            weights=first.weights,
            finished_at=time.time(),
        )
        return dataclasses.replace(merged, **fields)

    def to_json(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        weights, extra = out.pop("weights"), out.pop("extra")
        if not self.workers:
            del out["workers"]
        return {**out, **weights, **extra}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunRecord:
        names = {f.name for f in dataclasses.fields(cls)} - {"weights", "extra"}
        known = {k: v for k, v in data.items() if k in names}
        rest = {k: v for k, v in data.items() if k not in names}
        weights = {k: rest.pop(k) for k in list(rest) if k in WEIGHT_FIELDS}
        return cls(**known, weights=weights, extra=rest)


# what prepare_weights and the KV cache add to a record (the model-memory section reads them)
WEIGHT_FIELDS = (
    "dtype",
    "dtype_reason",
    "kv_cache_dtype",
    "quality",
    "quantization",
    "weight_bytes",
    "num_quantized_layers",
    "keep_in_16bit",
    "kv_bytes_per_token",
    "num_kv_blocks",
)
