"""Timelines in the run directory: telemetry/device.parquet, steps.parquet and rows.parquet
(per finished row: its work, its share of the step time, its latencies and its cost).

Each invocation of a job (a resume is a new one) appends its rows with a `run` column, so the
files always cover the whole job. Written atomically (temporary name, then rename).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from jobrunner.errors import RunDirError
from jobrunner.telemetry.spill import SpillLog, arrow_schema, to_table

DEVICE_FILE = "device.parquet"
STEPS_FILE = "steps.parquet"
ROWS_FILE = "rows.parquet"
BATCH_ROWS = 65_536  # rows per batch when a timeline is copied or read

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
    "prefill_context_tokens",  # what prefill attention reads (ScheduledBatch)
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


def telemetry_dir(run_path: str | Path) -> Path:
    return Path(run_path) / "telemetry"


def append_timeline(
    path: Path, records: list[dict[str, Any]] | SpillLog, columns: list[str], run: int
) -> None:
    """Append `records` (tagged with `run`) to the Parquet file at `path`, streaming: the old
    runs' rows and a SpillLog's parts are copied batch by batch, never held whole."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not records:
        return
    schema = arrow_schema(columns)
    tables = records.tables() if isinstance(records, SpillLog) else _chunks(records, columns)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with pq.ParquetWriter(tmp, schema) as w:
            if path.is_file():
                f = _parquet_file(path)
                have = [c for c in columns if c in f.schema_arrow.names]
                for batch in f.iter_batches(BATCH_ROWS, columns=have):
                    old = _conform(pa.Table.from_batches([batch]), schema)
                    w.write_table(old.filter(pa.compute.not_equal(old["run"], float(run))))
            for t in tables:
                t = t.select(columns).cast(schema)
                i = columns.index("run")
                w.write_table(t.set_column(i, "run", pa.array([float(run)] * len(t), pa.float64())))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _conform(t: Any, schema: Any) -> Any:
    """`t` with `schema`'s columns and types: a column an older run's file lacks is null."""
    import pyarrow as pa

    for f in schema:
        if f.name not in t.column_names:
            t = t.append_column(f.name, pa.nulls(len(t), f.type))
    return t.select(schema.names).cast(schema)


def _chunks(records: list[dict[str, Any]], columns: list[str]) -> Iterator[Any]:
    for i in range(0, len(records), BATCH_ROWS):
        yield to_table(records[i : i + BATCH_ROWS], columns)


def read_timeline(run_path: str | Path, name: str) -> list[dict[str, Any]]:
    """A whole timeline as records: for device.parquet (one sample a second) and tests; the
    per-step and per-row files are read with timeline_batches or sample_timeline."""
    path = telemetry_dir(run_path) / name
    return _parquet_file(path).read().to_pylist() if path.is_file() else []


def timeline_batches(
    run_path: str | Path, name: str, columns: list[str] | None = None
) -> Iterator[Any]:
    """A timeline's record batches (pyarrow), in bounded memory; none when the file is absent."""
    path = telemetry_dir(run_path) / name
    if not path.is_file():
        return
    f = _parquet_file(path)
    names = [c for c in (columns or f.schema_arrow.names) if c in f.schema_arrow.names]
    yield from f.iter_batches(BATCH_ROWS, columns=names)


def column_floats(batch: Any, name: str) -> Any:
    """A batch's column as a float64 numpy array, NaN for nulls (all NaN when it is absent)."""
    import numpy as np

    i = batch.schema.get_field_index(name)
    if i < 0:
        return np.full(len(batch), np.nan)
    return batch.column(i).to_numpy(zero_copy_only=False).astype(np.float64)


def sample_timeline(run_path: str | Path, name: str, limit: int) -> tuple[list[dict], int]:
    """At most `limit` records, evenly spread over the file, and the stride between them (each
    stands for `stride` records): what a chart needs of a timeline of any length."""
    path = telemetry_dir(run_path) / name
    if not path.is_file():
        return [], 1
    n = _parquet_file(path).metadata.num_rows
    stride = max(1, -(-n // limit))
    out: list[dict[str, Any]] = []
    seen = 0
    for batch in timeline_batches(run_path, name):
        first = (-seen) % stride  # the batch's first row whose global index is a multiple
        out += batch.slice(first).take(list(range(0, len(batch) - first, stride))).to_pylist()
        seen += len(batch)
    return out, stride


def _parquet_file(path: Path) -> Any:
    """A timeline's pyarrow ParquetFile; one that does not read is named (78) with what to do."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(path)
    except pa.ArrowInvalid as e:  # not Parquet: truncated, overwritten
        raise RunDirError(
            f"{path} does not read ({e}): it was damaged after it was written. Move it out of"
            " the run directory and run again (the reports then leave out the earlier runs'"
            " telemetry)"
        ) from e
