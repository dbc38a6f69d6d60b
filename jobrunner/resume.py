"""Opening a run directory: lock it, check it holds this job, and find what is left to do.

Runs before any model is loaded: duplicate ids and a changed job are refused here.
The lock is io/run_lock.py's: an flock the kernel drops when its process dies (even by kill -9),
so a crashed run never blocks the next one.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from jobrunner import run_schema
from jobrunner.config import JobConfig, fingerprint
from jobrunner.errors import InputDataError, ResumeMismatch
from jobrunner.formats import input_files, shard_format
from jobrunner.input_check import InputCheck
from jobrunner.input_scan import (  # noqa: F401  (scan_ids: callers)
    Scan,
    metadata_rows,
    scan_ids,
    scan_input,
)
from jobrunner.io.fs import is_remote
from jobrunner.io.identity import (
    ROWS_FILE,
    FileChanges,
    RowDigestFile,
    RowDigests,
    compare_files,
    content_key,
    file_records,
    input_root,
    is_legacy,
    legacy_changes,
)
from jobrunner.io.ids import IdSet, hash_ids
from jobrunner.io.run_lock import run_lock
from jobrunner.io.rundir import Manifest, RunDir, make_run_dir

MAX_DUPLICATES_LISTED = 10
log = logging.getLogger(__name__)


def job_parts(cfg: JobConfig, previous_input: list | None = None) -> dict:
    """The settings that make two runs the same job, and the input's files by content.

    `previous_input` (the manifest's records) lets unchanged files (size and mtime) skip hashing.
    """
    parts = cfg.fingerprint_parts()
    prev = None if is_legacy(previous_input) else previous_input
    files = input_files(cfg.input.path, cfg.input.format)
    parts["input"] = file_records(files, input_root(cfg.input.path), prev)
    return json.loads(json.dumps(parts, default=str))


def job_fingerprint(parts: dict) -> dict:
    """One short hash per part; the input's by names and contents (not sizes or times)."""
    return {k: fingerprint(content_key(v) if k == "input" else v) for k, v in parts.items()}


@contextlib.contextmanager
def open_run(rundir: RunDir, cfg: JobConfig, opts) -> Iterator[tuple[Manifest, IdSet, int]]:
    """Yields (manifest, ids already terminal, input rows), the input wholly checked. Holds the
    run lock meanwhile."""
    with start_run(rundir, cfg, opts) as (manifest, committed, total, check):
        check.wait()
        yield manifest, committed, total


# An input of at least this many rows (by its Parquet footers) is checked while the engine
# starts, and before its first commit; a smaller one (seconds of scanning) before the model
# loads, so its duplicate ids cost no model load (DESIGN.md, promise 9).
CHECK_WHILE_STARTING_ROWS = 5_000_000


@contextlib.contextmanager
def start_run(
    rundir: RunDir, cfg: JobConfig, opts
) -> Iterator[tuple[Manifest, IdSet, int, InputCheck]]:
    """open_run, yielding before the whole-input pass where the run can do without it: a local
    run directory, every input file Parquet read by the column preparer (its row count is in the
    footers), at least CHECK_WHILE_STARTING_ROWS rows and no input change to explain. The pass (duplicate ids, strays, row digests) then
    runs in the yielded InputCheck, which the run waits for before its first commit."""
    rundir.check_ours()  # before any folder or lock file: a directory not ours gets nothing
    make_run_dir(rundir.path)  # a store run directory's local staging directory
    with run_lock(rundir.path):
        rundir.check_ours()
        if opts.restart:
            rundir.clear()
        manifest = rundir.prepare()
        _adopt_if_empty(rundir, manifest)
        parts = job_parts(cfg, manifest.job.get("input"))
        _check_settings(rundir, manifest, parts)
        changes = _input_changes(manifest, parts)
        total = None if changes or is_remote(str(rundir.location)) else metadata_rows(cfg)
        if total is None or total < CHECK_WHILE_STARTING_ROWS:
            yield (*_checked_now(rundir, cfg, opts, manifest, parts, changes), InputCheck())
            return
        rundir.schema = run_schema.settle(manifest, cfg)  # Parquet: from the files' footers
        if opts.retry_errors:
            log.info(
                "--retry-errors: %d failed rows will run again", rundir.forget_failed(manifest)
            )
        committed = rundir.committed_idset()
        rundir.save_manifest(manifest)  # a run's directory from here on, naming no new input
        check = _later(rundir, cfg, manifest, parts, committed, total)
        try:
            yield manifest, committed, total, check.start()
        finally:
            check.cancel()


def _adopt_if_empty(rundir: RunDir, manifest: Manifest) -> None:
    """A run directory that committed no row (a run stopped by a mistake in its job file, at
    start) has nothing a changed job could mix with: it takes this job's settings."""
    if not (manifest.fingerprint or manifest.schema) or not holds_no_rows(rundir, manifest):
        return
    if manifest.fingerprint:
        log.info("%s holds no results yet: it takes this job's settings", rundir.location)
    # the schema too: a start refused before its first commit (duplicate ids in a large input,
    # checked while the engine starts) saved one for an input that may since have changed
    manifest.fingerprint, manifest.job, manifest.schema = {}, {}, {}


def holds_no_rows(rundir: RunDir, manifest: Manifest) -> bool:
    return not (manifest.shards or manifest.errors_bytes or rundir.shard_files())


def _checked_now(rundir, cfg, opts, manifest: Manifest, parts, changes) -> tuple:
    """The whole-input pass before the run: (manifest, committed ids, input rows)."""
    rows_file = rundir.path / ROWS_FILE
    have_rows = bool(manifest.fingerprint) and RowDigests.readable(rows_file)
    names = [r["path"] for r in parts["input"]]
    need = changes.paths & set(names) if have_rows else set(names)
    # Without earlier digests every file's are made: streamed to disk, not kept in memory.
    with RowDigestFile(rows_file) if not have_rows else contextlib.nullcontext() as sink:
        typed = not manifest.schema and cfg.output.keep_input_columns  # else nothing to type
        scan = scan_input(cfg, need, rows=sink, schemas=typed)
        rundir.schema = run_schema.settle(manifest, cfg, scan.schemas)  # JSONL: typed in the scan
        _check_scan(rundir, manifest, cfg, opts, scan, changes, have_rows)
        committed = rundir.committed_idset()
        _check_no_strays(rundir, committed, scan)
        if sink is not None:  # before the manifest that names its input
            sink.commit()
        elif need or changes:
            scan.rows.save(rows_file, replacing=need | changes.paths)
    if need or changes:
        rundir.keep_side_file(ROWS_FILE)
    manifest.fingerprint, manifest.job = job_fingerprint(parts), parts
    rundir.save_manifest(manifest)
    return manifest, committed, scan.total


def _later(rundir, cfg, manifest: Manifest, parts, committed: IdSet, total: int) -> InputCheck:
    """The pass as an InputCheck: the manifest names this input only once it passed, so a run
    stopped before (killed, or refused for duplicate ids) leaves the run directory as it was."""
    rows_file = rundir.path / ROWS_FILE
    have_rows = bool(manifest.fingerprint) and RowDigests.readable(rows_file)
    need = set() if have_rows else {r["path"] for r in parts["input"]}

    def scan(stop) -> None:
        with RowDigestFile(rows_file) if need else contextlib.nullcontext() as sink:
            found = scan_input(cfg, need, rows=sink, stop=stop, expect_rows=total)
            if stop.is_set():
                return
            if found.duplicates:
                raise InputDataError(describe_duplicates(cfg, found.duplicates))
            _check_no_strays(rundir, committed, found)
            if sink is not None:  # before the manifest that names its input
                sink.commit()

    def settle() -> None:
        if need:
            rundir.keep_side_file(ROWS_FILE)
        manifest.fingerprint, manifest.job = job_fingerprint(parts), parts
        rundir.save_manifest(manifest)

    return InputCheck(scan, settle)


def _check_scan(rundir, manifest, cfg, opts, scan: Scan, changes, have_rows: bool) -> None:
    """Duplicate ids and a changed input are refused; --retry-errors forgets failed rows."""
    if scan.duplicates:
        raise InputDataError(describe_duplicates(cfg, scan.duplicates))
    if changes:
        old_rows = RowDigests.load(rundir.path / ROWS_FILE, changes.paths) if have_rows else None
        _accept_changes(rundir, changes, old_rows, scan.rows, opts.retry_errors)
    if opts.retry_errors:
        log.info("--retry-errors: %d failed rows will run again", rundir.forget_failed(manifest))


def check_same_job(rundir: RunDir, cfg: JobConfig) -> None:
    """A finished run directory answers only its own job: raise ResumeMismatch otherwise. One
    not finished that holds no row takes any job, as `run` lets it (_adopt_if_empty)."""
    manifest = rundir.load_manifest()
    if manifest is None or not manifest.fingerprint:
        return
    if not rundir.finished and holds_no_rows(rundir, manifest):
        return
    parts = job_parts(cfg, manifest.job.get("input"))
    _check_settings(rundir, manifest, parts)
    changes = _input_changes(manifest, parts)
    if changes:
        old_rows = RowDigests.load(rundir.path / ROWS_FILE, changes.paths)
        scan = scan_input(cfg, changes.paths, count=False)
        _accept_changes(rundir, changes, old_rows, scan.rows, retry_errors=False)


def describe_duplicates(cfg: JobConfig, duplicates: dict[str, list[str]]) -> str:
    """The scan's duplicate ids, each with every place it occurs (files named relative to the
    input root, which the first line names)."""
    shown = list(duplicates.items())[:MAX_DUPLICATES_LISTED]
    lines = [f"  id {k!r} at {', '.join(v)}" for k, v in shown]
    more = len(duplicates) - len(shown)
    tail = [f"  ... and {more} more"] if more > 0 else []
    head = f"{len(duplicates)} duplicate ids in the input at {input_root(cfg.input.path)}"
    return "\n".join([f"{head} (ids must be unique):", *lines, *tail])


def _check_settings(rundir: RunDir, manifest: Manifest, parts: dict) -> None:
    """Every fingerprinted setting but the input (compared by content, `_input_changes`)."""
    if not manifest.fingerprint:
        return
    fp = job_fingerprint({k: v for k, v in parts.items() if k != "input"})
    gone = [k for k in manifest.fingerprint if k not in fp and k != "input"]  # task: embed left
    changed = [k for k in [*fp, *gone] if manifest.fingerprint.get(k) != fp.get(k)]
    settings = [k for k in changed if k != "output"]
    lines = [d for k in settings for d in _diff(k, manifest.job.get(k), parts.get(k))]
    if "output" in changed:
        lines += _output_changes(rundir, manifest.job.get("output"), parts["output"])
    if settings or lines:
        raise ResumeMismatch(
            f"{rundir.location} holds a different job; changed since it started:\n"
            + "\n".join(f"  {d}" for d in lines[:MAX_DUPLICATES_LISTED])
            + "\nrun the earlier job file again to continue it, use a new output.path,"
            " or --restart to discard the earlier results"
        )


def _output_changes(rundir: RunDir, old: dict | None, new: dict) -> list[str]:
    """The output settings that changed. A manifest from before they were recorded (`old`
    None) is held to its shards: one of another format than this job's is a changed format."""
    if old is not None:
        return _diff("output", old, new)
    suffix = shard_format(new["format"]).suffix
    found = sorted({Path(str(f)).suffix for f in rundir.shard_files()} - {suffix})
    return (
        [f"output.format: results/ holds {', '.join(found)} shards -> {new['format']!r}"]
        if found
        else []
    )


def _input_changes(manifest: Manifest, parts: dict) -> FileChanges:
    old = manifest.job.get("input") if manifest.fingerprint else None
    if old is None:
        return FileChanges()
    if is_legacy(old):
        return legacy_changes(old, parts["input"])
    return compare_files(old, parts["input"])


def _accept_changes(
    rundir: RunDir,
    changes: FileChanges,
    old_rows: RowDigests | None,
    new_rows: RowDigests,
    retry_errors: bool,
) -> None:
    """Changed input is refused (78), naming each file and row, unless --retry-errors asks and
    no row that succeeded changed or left the input: failed rows run again on the new input."""
    detail = _row_changes(changes, old_rows, new_rows)
    if retry_errors and detail is not None:
        changed, removed, _ = detail
        kept = (changed | removed) & rundir.succeeded_ids()
        if not kept:
            log.info("--retry-errors: the input changed only in rows that failed")
            return
        why = f"{len(kept)} rows that succeeded changed or left the input ({_few(kept)})"
    elif retry_errors:
        why = f"no {ROWS_FILE} to tell which rows changed"
    else:
        why = None
    lines = changes.lines()
    if detail is not None:
        changed, removed, added = detail
        for label, ids in (("changed", changed), ("gone", removed), ("new", added)):
            if ids:
                lines.append(f"rows {label}: {len(ids)} ({_few(ids)})")
    raise ResumeMismatch(
        f"{rundir.location} was started on a different input; changed since:\n"
        + "\n".join(f"  {d}" for d in lines[: 2 * MAX_DUPLICATES_LISTED])
        + (f"\n--retry-errors cannot take it: {why}" if why else "")
        + "\nrun with the earlier input to continue, --retry-errors if only failed rows"
        " changed, a new output.path, or --restart to discard the earlier results"
    )


def _row_changes(
    changes: FileChanges, old_rows: RowDigests | None, new_rows: RowDigests
) -> tuple[set[str], set[str], set[str]] | None:
    """(changed, removed, added) ids within the changed files; None without the old digests."""
    if old_rows is None:
        return None
    old, new = old_rows.ids(changes.paths), new_rows.ids(changes.paths)
    changed = {i for i in old.keys() & new.keys() if old[i] != new[i]}
    return changed, old.keys() - new.keys(), new.keys() - old.keys()


def _check_no_strays(rundir: RunDir, committed: IdSet, scan: Scan) -> None:
    """Committed rows whose id the input no longer has are never kept silently."""
    stray = committed.hashes[~scan.ids.contains_hashes(committed.hashes)]
    if len(stray):
        shown = _stray_ids(rundir, stray)
        raise ResumeMismatch(
            f"{rundir.location} holds {len(stray)} committed rows whose ids are not in the input"
            f" ({_few(shown, total=len(stray))}): the input or how ids are derived changed since"
            " the run started; run with the earlier input, use a new output.path, or --restart"
        )


def _stray_ids(rundir: RunDir, stray: np.ndarray, n: int = 5) -> set[str]:
    """The first few committed ids among the `stray` hashes, read back from the shards."""
    from jobrunner.io.rundir import read_id_array

    found: set[str] = set()
    ids = [read_id_array(f) for f in rundir.shard_files()]
    errors = [str(e["id"]) for e in rundir.iter_errors() if e.get("id") is not None]
    for chunk in [*ids, errors]:
        hits = np.flatnonzero(np.isin(hash_ids(chunk), stray)) if len(chunk) else []
        for k in hits[: n - len(found)]:
            v = chunk[int(k)]
            found.add(str(v.as_py() if hasattr(v, "as_py") else v))
        if len(found) >= n:
            break
    return found


def _few(ids: set[str], n: int = 5, total: int | None = None) -> str:
    shown = sorted(ids)[:n]
    total = len(ids) if total is None else total
    return ", ".join(repr(i) for i in shown) + (
        f", ... {total - len(shown)} more" if total > len(shown) else ""
    )


def _diff(key: str, old, new) -> list[str]:
    """`key.path: old -> new` for each setting that differs (old is None for old manifests)."""
    if isinstance(old, dict) and isinstance(new, dict):
        return [
            d
            for k in sorted(set(old) | set(new))
            for d in _diff(f"{key}.{k}", old.get(k), new.get(k))
            if old.get(k) != new.get(k)
        ]
    if old is None:
        return [key]
    return [f"{key}: {old!r} -> {new!r}"]
