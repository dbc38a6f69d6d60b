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

import itertools
import json
import pickle
import re
import shutil
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from jobrunner.config import JobConfig
from jobrunner.formats import (
    detect_format,
    file_partitions,
    input_files,
    input_format,
    make_preparer,
    read_file,
)
from jobrunner.formats.lines import Line, iter_lines
from jobrunner.formats.parquet import open_parquet, read_parquet_ranges
from jobrunner.input_scan import metadata_rows
from jobrunner.io.identity import input_root
from jobrunner.io.ids import IdSet, batch_ids, committed, hash_ids, iter_id_batches
from jobrunner.io.partitions import Values, add_partitions, check_names, with_partitions
from jobrunner.io.readers import Item, RawRow
from jobrunner.io.row_ranges import runs
from jobrunner.io.rundir import Manifest, RunDir
from jobrunner.io.writers import write_text_atomic
from jobrunner.prep.prepare import derived_name
from jobrunner.types import RowError, RowRef

FRAGMENTS_DIR = "ray-errors"
RUN_TOKEN = ".ray-run"  # the tag of the driver now running; stale workers must not commit
CHECK_ROWS = 1024  # rows checked against the committed ids at once (other formats)
_TAG = re.compile(r"part-r(\d+)-b(\d+)\.")


@dataclass
class Plan:
    """What the driver hands to Ray: blocks (a Parquet block names its file and row ranges, a
    JSONL one a span of lines and its rows, the worker reads them; CSV blocks hold their pickled
    rows), plus what it settled."""

    blocks: list[dict] = field(default_factory=list)  # {"block": k, "payload": bytes}
    errors: list[RowError] = field(default_factory=list)  # unreadable rows, bad ids
    skipped: int = 0  # rows already committed by an earlier run
    rows: int = 0  # rows in blocks


def plan_blocks(cfg: JobConfig, skip_ids: IdSet | set[str], block_rows: int) -> Plan:
    """Pending rows in blocks of block_rows, none across two files. Parquet read by the column
    preparer: from the id column alone (vectorized, no row in the driver), each block its file
    and row ranges. Line formats (JSONL, OpenAI batch files): read once here for their ids (our
    readers, our id rules), each block a span of lines and the rows in it to run. Other inputs (CSV): read once here, their rows pickled into the blocks."""
    if metadata_rows(cfg) is not None:
        return _described(
            cfg, skip_ids if isinstance(skip_ids, IdSet) else IdSet.of(skip_ids), block_rows
        )
    preparer = make_preparer(cfg, tokenizer=None)
    plan = Plan()
    for file in input_files(cfg.input.path, cfg.input.format):
        fmt = input_format(detect_format(file, cfg.input.format))
        if fmt.parse_line is not None:
            values = file_partitions(file, cfg.input, fmt.name)
            _line_blocks(plan, file, fmt, preparer, skip_ids, block_rows, values)
        else:
            items = read_file(file, cfg.input, kind=fmt.name)
            _row_blocks(plan, items, preparer, skip_ids, block_rows)
    return plan


def _pending(plan: Plan, items: list[Item], preparer, skip_ids) -> list[bool]:
    """For each item: whether it is a row to run. Unreadable rows and bad ids go to
    plan.errors, committed rows to plan.skipped."""
    row_ids = [i if isinstance(i, RowError) else preparer.row_id(i) for i in items]
    done = committed(skip_ids, [i if isinstance(i, str) else None for i in row_ids])
    keep = []
    for row_id, skip in zip(row_ids, done, strict=True):
        if isinstance(row_id, RowError):
            plan.errors.append(row_id)
        elif skip:
            plan.skipped += 1
        keep.append(not skip and not isinstance(row_id, RowError))
    return keep


def _row_blocks(plan: Plan, items: Iterable[Item], preparer, skip_ids, block_rows: int) -> None:
    cur: list[RawRow] = []
    while chunk := list(itertools.islice(items, CHECK_ROWS)):
        for item, keep in zip(chunk, _pending(plan, chunk, preparer, skip_ids), strict=True):
            if keep:
                cur.append(item)
            if len(cur) == block_rows:
                _add_block(plan, cur, preparer)
                cur = []
    if cur:
        _add_block(plan, cur, preparer)


def _line_blocks(
    plan: Plan, file: str, fmt, preparer, skip_ids, block_rows: int, values: Values
) -> None:
    """Blocks of `file` as spans of lines: where the first pending line starts, where the last
    one ends, and the rows between them to run (committed and unreadable ones left out). A
    compressed file's offsets are its text's: a worker reads its stream past the text before
    its span (formats/lines.iter_lines). `values`: the file's partition columns."""
    pending = _pending_lines(plan, file, fmt, preparer, skip_ids, values)
    while cur := list(itertools.islice(pending, block_rows)):
        first, rows = cur[0], np.fromiter((ln.row for ln in cur), np.int64, len(cur))
        start = (first.byte, first.line, first.row)
        _add_span(plan, file, fmt.name, start, cur[-1].end, rows, preparer, values)


def _pending_lines(plan: Plan, file: str, fmt, preparer, skip_ids, values) -> Iterator[Line]:
    """The lines of `file` to run, without their text (the driver keeps no row's)."""
    lines = iter_lines(file)
    while chunk := list(itertools.islice(lines, CHECK_ROWS)):
        items = [
            add_partitions(fmt.parse_line(ln.raw, RowRef(file, ln.row, line=ln.line)), values)
            for ln in chunk
        ]
        for ln, keep in zip(chunk, _pending(plan, items, preparer, skip_ids), strict=True):
            if keep:
                yield ln._replace(raw=b"")


def _add_span(
    plan: Plan, file: str, fmt: str, start, stop, rows: np.ndarray, preparer, values: Values
) -> None:
    """A block of `rows` (sorted) of the lines from `start` = (byte, line, row) to byte `stop`
    (None: the end); its rows take the partition columns `values`."""
    span = {"file": file, "format": fmt, "start": start, "stop": stop, "rows": _runs(rows)}
    has_ids = preparer.file_ids([file])
    payload = pickle.dumps({"lines": span, "file_has_ids": has_ids, "partitions": values})
    plan.blocks.append({"block": len(plan.blocks), "payload": payload})
    plan.rows += len(rows)


def _described(cfg: JobConfig, done: IdSet, block_rows: int) -> Plan:
    """Blocks of Parquet rows as (file, ranges): rows whose id is committed are left out; a row
    whose id is invalid stays in, and its worker reports it (as the local run's Prep does)."""
    import pyarrow.compute as pc

    plan, root = Plan(), input_root(cfg.input.path)
    for file in input_files(cfg.input.path, cfg.input.format):
        name, cur = derived_name(file, root), []
        values = file_partitions(file, cfg.input, "parquet")
        if values:  # refused here, not by a worker: the file's own columns are in its footer
            check_names(file, open_parquet(file).schema_arrow.names, values)
        for first, batch in iter_id_batches(file, "parquet", cfg.input.id_column):
            ids = batch_ids(batch, name, first, cfg.input.id_column, values)
            known = pc.is_valid(ids).to_numpy(zero_copy_only=False)
            done_rows = np.zeros(batch.num_rows, bool)
            if known.any():
                done_rows[known] = done.contains_hashes(hash_ids(pc.drop_null(ids)))
            pending = np.flatnonzero(~done_rows) + first
            plan.skipped += batch.num_rows - len(pending)
            cur.append(pending)
            while sum(map(len, cur)) >= block_rows:
                rows = np.concatenate(cur)
                _add_ranges(plan, file, rows[:block_rows], values)
                cur = [rows[block_rows:]]
        rows = np.concatenate(cur) if cur else np.empty(0, np.int64)
        if len(rows):
            _add_ranges(plan, file, rows, values)
    return plan


def _add_ranges(plan: Plan, file: str, rows: np.ndarray, values: Values) -> None:
    """A block of these (sorted) rows of `file`, which take the partition columns `values`."""
    payload = pickle.dumps({"file": file, "ranges": _runs(rows), "partitions": values})
    plan.blocks.append({"block": len(plan.blocks), "payload": payload})
    plan.rows += len(rows)


def _runs(rows: np.ndarray) -> list[tuple[int, int]]:
    """Sorted row numbers as [start, stop) runs of consecutive rows, as plain ints to pickle."""
    starts, stops = runs(rows)
    return [(int(a), int(b)) for a, b in zip(starts, stops, strict=True)]


def _add_block(plan: Plan, rows: list[RawRow], preparer) -> None:
    # Whether a file carries ids is decided by its first row; a block starting mid-file must
    # decide as the driver did, so the driver's answers travel with the block.
    files = {r.source.file for r in rows}
    has_ids = preparer.file_ids(files)
    payload = pickle.dumps({"rows": rows, "file_has_ids": has_ids})
    plan.blocks.append({"block": len(plan.blocks), "payload": payload})
    plan.rows += len(rows)


def unpack_block(payload: bytes, batch_rows: int = 1024) -> tuple[Iterable[Item], dict[str, bool]]:
    """A block's rows (read from its file when the block names ranges or lines, with the
    partition columns the driver found for it; a block of rows holds them already) and the
    driver's answers on which files carry ids (none for Parquet: its schema says)."""
    data = pickle.loads(payload)
    values = data.get("partitions") or {}
    if "ranges" in data:
        return with_partitions(
            read_parquet_ranges(data["file"], data["ranges"], batch_rows), values
        ), {}
    if "lines" in data:
        return with_partitions(_read_span(**data["lines"]), values), data["file_has_ids"]
    return data["rows"], data["file_has_ids"]


def _read_span(file: str, format: str, start, stop: int, rows: list[tuple[int, int]]):
    """The items of a span block: its lines parsed, but only the rows in `rows` (the others are
    committed, or reported unreadable by the driver)."""
    parse = input_format(format).parse_line
    runs = iter(rows)
    lo, hi = next(runs)
    for ln in iter_lines(file, start, stop):
        while ln.row >= hi:
            lo, hi = next(runs, (None, None))
            if lo is None:
                return
        if ln.row >= lo:
            yield parse(ln.raw, RowRef(file, ln.row, line=ln.line))


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
