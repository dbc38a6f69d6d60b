"""The Ray executor's bookkeeping in the run directory: blocks, shard names, error fragments.

No torch and no ray here. Names and invariants:
  - a *run tag* `r0007` is new for every driver invocation that starts work (one above the
    highest tag already in results/), so shard names never collide with an earlier run's;
  - block k of run r0007 commits exactly one shard, `results/part-r0007-b00012.parquet`, and
    before it (when the block has failed rows) one error fragment, `ray-errors/r0007-b00012.jsonl`;
    a retried block writes the same names again, so a retry replaces and never adds;
  - only the driver writes manifest.json and errors.jsonl: it merges each fragment into
    errors.jsonl, skipping lines already there, so merging twice (after a crash) adds nothing.
"""

from __future__ import annotations

import json
import pickle
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from jobrunner.config import JobConfig
from jobrunner.formats import make_preparer, read_rows
from jobrunner.io.readers import RawRow
from jobrunner.io.rundir import Manifest, RunDir
from jobrunner.io.writers import write_text_atomic
from jobrunner.types import RowError, RowRef

FRAGMENTS_DIR = "ray-errors"
RUN_TOKEN = ".ray-run"  # the tag of the driver now running; stale workers must not commit
_TAG = re.compile(r"part-r(\d+)-b(\d+)\.")


@dataclass
class Plan:
    """What the driver hands to Ray: pickled blocks of rows, plus what it settled itself."""

    blocks: list[dict] = field(default_factory=list)  # {"block": k, "payload": bytes}
    errors: list[RowError] = field(default_factory=list)  # unreadable rows, bad ids
    skipped: int = 0  # rows already committed by an earlier run
    rows: int = 0  # rows in blocks


def plan_blocks(cfg: JobConfig, skip_ids: set[str], block_rows: int) -> Plan:
    """Read the input once (our readers, our id rules); pending rows go in blocks of block_rows."""
    preparer = make_preparer(cfg, tokenizer=None)
    plan, cur = Plan(), []
    for item in read_rows(cfg.input.path, cfg.input.format, cfg.input.batch_rows):
        row_id = item if isinstance(item, RowError) else preparer.row_id(item)
        if isinstance(row_id, RowError):
            plan.errors.append(row_id)
        elif row_id in skip_ids:
            plan.skipped += 1
        else:
            cur.append(item)
        if len(cur) == block_rows:
            _add_block(plan, cur, preparer)
            cur = []
    if cur:
        _add_block(plan, cur, preparer)
    return plan


def _add_block(plan: Plan, rows: list[RawRow], preparer) -> None:
    # Whether a file carries ids is decided by its first row; a block starting mid-file must
    # decide as the driver did, so the driver's answers travel with the block.
    files = {r.source.file for r in rows}
    has_ids = preparer.file_ids(files)
    payload = pickle.dumps({"rows": rows, "file_has_ids": has_ids})
    plan.blocks.append({"block": len(plan.blocks), "payload": payload})
    plan.rows += len(rows)


def unpack_block(payload: bytes) -> tuple[list[RawRow], dict[str, bool]]:
    data = pickle.loads(payload)
    return data["rows"], data["file_has_ids"]


# ------------------------------------------------------------------ names


def next_run_tag(rundir: RunDir) -> str:
    tags = [int(m[1]) for p in rundir.shard_files() if (m := _TAG.match(p.name))]
    tags += [int(m[1]) for p in fragment_files(rundir) if (m := re.match(r"r(\d+)-", p.name))]
    token = rundir.path / RUN_TOKEN  # a run that died before committing anything still counts
    if token.is_file() and (m := re.fullmatch(r"r(\d+)", token.read_text(encoding="utf-8"))):
        tags.append(int(m[1]))
    return f"r{(max(tags) + 1 if tags else 1):04d}"


def shard_path(rundir: RunDir, tag: str, block: int) -> Path:
    return rundir.results / f"part-{tag}-b{block:05d}{rundir.shards.suffix}"


def fragment_path(rundir: RunDir, tag: str, block: int) -> Path:
    return rundir.path / FRAGMENTS_DIR / f"{tag}-b{block:05d}.jsonl"


def fragment_files(rundir: RunDir) -> list[Path]:
    d = rundir.path / FRAGMENTS_DIR
    return sorted(d.glob("r*.jsonl")) if d.is_dir() else []


def claim_run(rundir: RunDir, tag: str) -> None:
    write_text_atomic(rundir.path / RUN_TOKEN, tag)


def is_current_run(rundir: RunDir, tag: str) -> bool:
    try:
        return (rundir.path / RUN_TOKEN).read_text(encoding="utf-8") == tag
    except OSError:
        return False


# ------------------------------------------------------------- fragments


def write_fragment(path: Path, errors: list[RowError]) -> None:
    """RowError.to_json lines (whatever the output format): merge_errors rebuilds RowErrors."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, "".join(_line(e.to_json()) for e in errors))


def clear_fragments(rundir: RunDir) -> None:
    shutil.rmtree(rundir.path / FRAGMENTS_DIR, ignore_errors=True)
    (rundir.path / RUN_TOKEN).unlink(missing_ok=True)


def merge_errors(
    rundir: RunDir, m: Manifest, errors: list[RowError], fragments: list[Path] = ()
) -> int:
    """Append errors and fragment lines to errors.jsonl unless already there; then drop the
    fragments. Returns how many lines were added. Idempotent: a crash anywhere is safe."""
    seen = {_line(e) for e in rundir.iter_errors()}  # lines in the output format's shape
    new: list[RowError] = []
    for e in [*errors, *(_from_json(d) for f in fragments for d in _read_lines(f))]:
        key = _line(rundir.error_record(e))
        if key not in seen:
            seen.add(key)
            new.append(e)
    if new:
        rundir.commit(m, [], new)
    for f in fragments:
        f.unlink(missing_ok=True)
    return len(new)


def _read_lines(path: Path) -> Iterator[dict]:
    if not path.is_file():
        return
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def _from_json(d: dict) -> RowError:
    ref = RowRef(d["file"], d["row"], d.get("line")) if d.get("file") is not None else None
    return RowError(d["code"], d["message"], ref, d.get("id"), d.get("field"))


def _line(d: dict) -> str:
    return json.dumps(d, ensure_ascii=False, sort_keys=True) + "\n"
