"""Timelines in the run directory: telemetry/device.parquet, steps.parquet and rows.parquet
(per finished row: its work, its share of the step time, its latencies and its cost).

Each invocation of a job (a resume is a new one) appends its rows with a `run` column, so the
files always cover the whole job. Written atomically (temporary name, then rename).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

DEVICE_FILE = "device.parquet"
STEPS_FILE = "steps.parquet"
ROWS_FILE = "rows.parquet"

DEVICE_COLUMNS = [
    "run",
    "t",
    "elapsed_s",
    "device",
    "util_percent",
    "mem_used_bytes",
    "mem_total_bytes",
    "power_w",
    "temperature_c",
    "sm_clock_mhz",
    "energy_mj",
]
STEP_COLUMNS = [
    "run",
    "t",
    "num_running",
    "num_waiting",
    "batch_tokens",
    "prefill_tokens",
    "decode_tokens",
    "kv_blocks_used",
    "step_seconds",
    "preemptions",
    "worker",  # executor: ray (None for a local run)
]

ROW_COLUMNS = [
    "run",
    "prompt_tokens",
    "cached_tokens",
    "completion_tokens",
    "prefill_tokens",
    "decode_tokens",
    "device_seconds",
    "first_token_seconds",
    "decode_seconds",
    "shared_with",
    "cost_usd",
]


def row_record(r) -> dict[str, Any]:
    """A finished row's telemetry (a Result: its Usage and how many shared its computation)."""
    u = r.usage
    rec = {c: getattr(u, c, None) for c in ROW_COLUMNS}
    rec["shared_with"] = r.shared_with
    return rec


STRING_COLUMNS = ("device", "worker")


def telemetry_dir(run_path: str | Path) -> Path:
    return Path(run_path) / "telemetry"


def append_timeline(
    path: Path, records: list[dict[str, Any]], columns: list[str], run: int
) -> None:
    """Append `records` (tagged with `run`) to the Parquet file at `path`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not records:
        return
    rows = [{c: (run if c == "run" else _num(rec.get(c))) for c in columns} for rec in records]
    schema = pa.schema([(c, pa.string() if c in STRING_COLUMNS else pa.float64()) for c in columns])
    new = pa.Table.from_pylist(rows, schema=schema)
    if path.is_file():
        old = pq.read_table(path).select(columns).cast(schema)
        old = old.filter(pa.compute.not_equal(old["run"], float(run)))
        new = pa.concat_tables([old, new])
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    pq.write_table(new, tmp)
    os.replace(tmp, path)


def _num(v: Any) -> Any:
    return v if v is None or isinstance(v, str) else float(v)


def read_timeline(run_path: str | Path, name: str) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    path = telemetry_dir(run_path) / name
    return pq.read_table(path).to_pylist() if path.is_file() else []
