"""Output formats, looked up by `output.format`: how result shards are written, how an
errors.jsonl line looks, and which files are assembled from the committed shards at the end.

The shards in results/ stay the committed truth for every format (resume, costs and reports read
them); `finalize` only derives files from them, atomically, before _SUCCESS is written.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jobrunner.config import JobConfig
    from jobrunner.io.rundir import Manifest, RunDir
    from jobrunner.types import RowError


@dataclass(frozen=True)
class OutputFormat:
    shard_format: str  # a key of io.writers.WRITERS
    error_record: Callable[[RowError], dict[str, Any]] | None = None  # None: RowError.to_json
    finalize: Callable[[RunDir, Manifest, JobConfig], None] | None = None


OUTPUT_FORMATS: dict[str, OutputFormat] = {
    "parquet": OutputFormat("parquet"),
    "jsonl": OutputFormat("jsonl"),
}


def output_format(name: str) -> OutputFormat:
    import jobrunner.io.openai_batch  # noqa: F401  (registers openai-batch)

    return OUTPUT_FORMATS[name]
