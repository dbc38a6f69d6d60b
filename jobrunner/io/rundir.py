"""The run directory (DESIGN.md): committed shards, errors.jsonl, manifest.json, _SUCCESS.

Commit order, which makes any crash point safe:
  1. append the batch's error lines to errors.jsonl (fsync);
  2. write the result shard under a temporary name, fsync, rename into results/;
  3. replace manifest.json atomically, recording the shard and errors.jsonl's committed length.
On resume, errors.jsonl is cut back to the manifest's length (step 1 without 3 is redone) and any
complete shard in results/ counts as committed (step 2 without 3 loses nothing).
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobrunner.io.writers import SUFFIX, fsync_file, write_atomic, write_text_atomic
from jobrunner.types import RowError

MANIFEST_VERSION = 1


@dataclass
class Manifest:
    fingerprint: dict[str, Any] = field(default_factory=dict)
    shards: list[dict[str, Any]] = field(default_factory=list)  # {name, rows, succeeded, failed}
    errors_bytes: int = 0
    counts: dict[str, int] = field(default_factory=dict)  # succeeded, failed, skipped
    started_at: float = 0.0
    finished_at: float | None = None
    runs: list[dict[str, Any]] = field(default_factory=list)  # one record per invocation
    version: int = MANIFEST_VERSION

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


class RunDir:
    def __init__(self, path: str | Path, fmt: str = "parquet",
                 error_record: Callable[[RowError], dict[str, Any]] | None = None) -> None:
        self.path = Path(path)
        self.fmt = fmt
        self.error_record = error_record or RowError.to_json  # the output format's line shape
        self.results = self.path / "results"
        self.manifest_path = self.path / "manifest.json"
        self.errors_path = self.path / "errors.jsonl"
        self.success_path = self.path / "_SUCCESS"

    # ----------------------------------------------------------------- state

    @property
    def finished(self) -> bool:
        return self.success_path.is_file()

    def load_manifest(self) -> Manifest | None:
        if not self.manifest_path.is_file():
            return None
        data = json.loads(self.manifest_path.read_text(encoding="utf-8"))
        return Manifest(**{k: v for k, v in data.items() if k in Manifest.__dataclass_fields__})

    def save_manifest(self, m: Manifest) -> None:
        write_text_atomic(self.manifest_path, json.dumps(m.to_json(), indent=1, sort_keys=True))

    def prepare(self) -> Manifest:
        """Create the layout; after a crash, cut errors.jsonl back to what was committed."""
        self.results.mkdir(parents=True, exist_ok=True)
        m = self.load_manifest() or Manifest(started_at=time.time())
        if self.errors_path.exists() and self.errors_path.stat().st_size > m.errors_bytes:
            with open(self.errors_path, "r+b") as f:
                f.truncate(m.errors_bytes)
        for stale in self.results.glob(".*.tmp*"):
            stale.unlink(missing_ok=True)
        return m

    def shard_files(self) -> list[Path]:
        return sorted(p for p in self.results.iterdir() if p.name.startswith("part-")) if self.results.is_dir() else []

    def committed_ids(self) -> set[str]:
        """Every id with a terminal state: in a visible shard or in committed errors."""
        ids = {r for f in self.shard_files() for r in read_ids(f)}
        ids.update(e["id"] for e in self.iter_errors() if e.get("id") is not None)
        return ids

    def iter_errors(self) -> Iterator[dict[str, Any]]:
        if not self.errors_path.is_file():
            return
        with open(self.errors_path, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    yield json.loads(line)

    # ---------------------------------------------------------------- commit

    def next_shard_name(self) -> str:
        # Only plain `part-NNNNN` names: other executors name theirs `part-r0001-b00000` etc.
        nums = [int(m[1]) for p in self.shard_files() if (m := re.match(r"part-(\d+)\.", p.name))]
        return f"part-{(max(nums) + 1 if nums else 0):05d}{SUFFIX[self.fmt]}"

    def commit(self, m: Manifest, records: list[dict[str, Any]], errors: list[RowError]) -> None:
        if errors:
            with open(self.errors_path, "a", encoding="utf-8") as f:
                for e in errors:
                    f.write(json.dumps(self.error_record(e), ensure_ascii=False) + "\n")
                f.flush()
                os.fsync(f.fileno())
        m.errors_bytes = self.errors_path.stat().st_size if self.errors_path.exists() else 0
        if records:
            name = self.next_shard_name()
            write_atomic(records, self.results / name, self.fmt)
            m.shards.append({"name": name, "rows": len(records)})
        ok = sum(r["finish_reason"] != "error" for r in records)
        for key, n in (("succeeded", ok), ("failed", len(errors))):
            m.counts[key] = m.counts.get(key, 0) + n
        self.save_manifest(m)

    def mark_success(self, m: Manifest) -> None:
        m.finished_at = time.time()
        self.save_manifest(m)
        write_text_atomic(self.success_path, "")
        fsync_file(self.success_path)


def read_ids(path: Path) -> list[str]:
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return [str(x) for x in pq.read_table(path, columns=["id"]).column("id").to_pylist()]
    with open(path, encoding="utf-8") as f:
        return [str(json.loads(line)["id"]) for line in f if line.strip()]
