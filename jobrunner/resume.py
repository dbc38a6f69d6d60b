"""Opening a run directory: lock it, check it holds this job, and find what is left to do.

Runs before any model is loaded: duplicate ids and a changed job are refused here.
The lock is an flock on `<run dir>/.lock`: the kernel drops it when its process dies (even by
kill -9), so a crashed run never blocks the next one.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass, field

from jobrunner.config import JobConfig, fingerprint
from jobrunner.errors import InputDataError, ResumeMismatch, RunLocked
from jobrunner.formats import input_files, make_preparer, read_rows
from jobrunner.io.identity import (
    ROWS_FILE,
    FileChanges,
    RowDigests,
    compare_files,
    content_key,
    file_records,
    input_root,
    is_legacy,
    legacy_changes,
    relative_name,
    row_digest,
)
from jobrunner.io.readers import Item, RawRow
from jobrunner.io.rundir import Manifest, RunDir, make_run_dir

MAX_DUPLICATES_LISTED = 10
log = logging.getLogger(__name__)


def job_parts(cfg: JobConfig, previous_input: list | None = None) -> dict:
    """The settings that make two runs the same job, and the input's files by content.

    `previous_input` (the manifest's records) lets unchanged files (size and mtime) skip hashing.
    """
    parts = cfg.fingerprint_parts()
    prev = None if is_legacy(previous_input) else previous_input
    files = input_files(cfg.input.path)
    parts["input"] = file_records(files, input_root(cfg.input.path), prev)
    return json.loads(json.dumps(parts, default=str))


def job_fingerprint(parts: dict) -> dict:
    """One short hash per part; the input's by names and contents (not sizes or times)."""
    return {k: fingerprint(content_key(v) if k == "input" else v) for k, v in parts.items()}


@contextlib.contextmanager
def open_run(rundir: RunDir, cfg: JobConfig, opts) -> Iterator[tuple[Manifest, set[str], int]]:
    """Yields (manifest, ids already terminal, input rows). Holds the run lock meanwhile."""
    make_run_dir(rundir.path)  # a store run directory's local staging directory
    rundir.check_ours()  # before the lock file: a directory that is not ours gets nothing
    with _lock(rundir):
        rundir.check_ours()
        if opts.restart:
            rundir.clear()
        manifest = rundir.prepare()
        parts = job_parts(cfg, manifest.job.get("input"))
        _check_settings(rundir, manifest, parts)
        old_rows = RowDigests.load(rundir.path / ROWS_FILE) if manifest.fingerprint else None
        changes = _input_changes(manifest, parts)
        names = [r["path"] for r in parts["input"]]
        need = set(names) if old_rows is None else changes.paths & set(names)
        scan = scan_input(cfg, need)
        if scan.duplicates:
            raise InputDataError(describe_duplicates(scan.duplicates))
        if changes:
            _accept_changes(rundir, changes, old_rows, scan.rows, opts.retry_errors)
        if opts.retry_errors:
            log.info(
                "--retry-errors: %d failed rows will run again", rundir.forget_failed(manifest)
            )
        committed = rundir.committed_ids()
        _check_no_strays(rundir, committed, scan)
        if need or changes:
            rows = old_rows or RowDigests()
            rows.replace(scan.rows, need | changes.paths)
            rows.save(rundir.path / ROWS_FILE)  # before the manifest that names its input
            rundir.keep_side_file(ROWS_FILE)
        manifest.fingerprint, manifest.job = job_fingerprint(parts), parts
        rundir.save_manifest(manifest)
        yield manifest, committed, scan.total


def check_same_job(rundir: RunDir, cfg: JobConfig) -> None:
    """A finished run directory answers only its own job: raise ResumeMismatch otherwise."""
    manifest = rundir.load_manifest()
    if manifest is None or not manifest.fingerprint:
        return
    parts = job_parts(cfg, manifest.job.get("input"))
    _check_settings(rundir, manifest, parts)
    changes = _input_changes(manifest, parts)
    if changes:
        old_rows = RowDigests.load(rundir.path / ROWS_FILE)
        scan = scan_input(cfg, changes.paths, count=False)
        _accept_changes(rundir, changes, old_rows, scan.rows, retry_errors=False)


@dataclass
class Scan:
    total: int = 0
    duplicates: dict[str, list[str]] = field(default_factory=dict)
    id_hashes: set[int] = field(default_factory=set)
    rows: RowDigests = field(default_factory=RowDigests)  # for the files asked for


def scan_input(cfg: JobConfig, digest_files: set[str], count: bool = True) -> Scan:
    """One pass over the input: rows, duplicate ids, and row digests of `digest_files`.

    Holds one 8-byte hash per id; only ids whose hashes meet are read again, with their places.
    """
    scan, suspects = Scan(), set()
    root, names = input_root(cfg.input.path), {}
    for row_id, item in _iter_ids(cfg, None if count else digest_files, root):
        scan.total += 1
        if row_id is not None:
            h = _id_hash(row_id)
            (suspects if h in scan.id_hashes else scan.id_hashes).add(h)
        elif getattr(item, "id", None) is not None:  # a row error that names its row
            scan.id_hashes.add(_id_hash(item.id))
        file = item.source.file if item.source else None
        if file is None:
            continue
        name = names.get(file) or names.setdefault(file, relative_name(file, root))
        if name in digest_files:
            values = item.values if isinstance(item, RawRow) else {"error": item.message}
            scan.rows.add(name, row_id, row_digest(values))
    if suspects:
        places: dict[str, list[str]] = {}
        for row_id, item in _iter_ids(cfg, None, root):
            if row_id is not None and _id_hash(row_id) in suspects:
                places.setdefault(row_id, []).append(str(item.source))
        scan.duplicates = {k: v for k, v in places.items() if len(v) > 1}
    return scan


def scan_ids(cfg: JobConfig) -> tuple[int, dict[str, list[str]]]:
    """Count rows and find duplicate ids with where each occurs, reading ids only."""
    scan = scan_input(cfg, set())
    return scan.total, scan.duplicates


def _iter_ids(cfg: JobConfig, only: set[str] | None, root) -> Iterator[tuple[str | None, Item]]:
    """(id, item) for every input item (of the files named in `only`, when given); None where
    the row has no valid id."""
    preparer = make_preparer(cfg, tokenizer=None)
    paths = [cfg.input.path]
    if only is not None:
        paths = [f for f in input_files(cfg.input.path) if relative_name(f, root) in only]
    for path in paths:
        for item in read_rows(path, cfg.input.format, cfg.input.batch_rows):
            row_id = preparer.row_id(item) if isinstance(item, RawRow) else item
            if isinstance(row_id, str):
                for rid in preparer.result_ids(row_id, item):
                    yield rid, item
            else:  # the row's error (bad id, unreadable row): it may still name the row
                yield None, row_id


def _id_hash(row_id: str) -> int:
    return int.from_bytes(hashlib.blake2b(row_id.encode(), digest_size=8).digest(), "little")


def describe_duplicates(duplicates: dict[str, list[str]]) -> str:
    shown = list(duplicates.items())[:MAX_DUPLICATES_LISTED]
    lines = [f"  id {k!r} at {', '.join(v)}" for k, v in shown]
    more = len(duplicates) - len(shown)
    tail = [f"  ... and {more} more"] if more > 0 else []
    return "\n".join(
        [f"{len(duplicates)} duplicate ids in the input (ids must be unique):", *lines, *tail]
    )


def _check_settings(rundir: RunDir, manifest: Manifest, parts: dict) -> None:
    """Every fingerprinted setting but the input (compared by content, `_input_changes`)."""
    if not manifest.fingerprint:
        return
    fp = job_fingerprint({k: v for k, v in parts.items() if k != "input"})
    changed = [k for k in fp if manifest.fingerprint.get(k) != fp[k]]
    if changed:
        lines = [d for k in changed for d in _diff(k, manifest.job.get(k), parts[k])]
        raise ResumeMismatch(
            f"{rundir.path} holds a different job; changed since it started:\n"
            + "\n".join(f"  {d}" for d in lines[:MAX_DUPLICATES_LISTED])
            + "\nrun the earlier job file again to continue it, use a new output.path,"
            " or --restart to discard the earlier results"
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
        f"{rundir.path} was started on a different input; changed since:\n"
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


def _check_no_strays(rundir: RunDir, committed: set[str], scan: Scan) -> None:
    """Committed rows whose id the input no longer has are never kept silently."""
    strays = {i for i in committed if _id_hash(i) not in scan.id_hashes}
    if strays:
        raise ResumeMismatch(
            f"{rundir.path} holds {len(strays)} committed rows whose ids are not in the input"
            f" ({_few(strays)}): the input or how ids are derived changed since the run"
            " started; run with the earlier input, use a new output.path, or --restart"
        )


def _few(ids: set[str], n: int = 5) -> str:
    shown = sorted(ids)[:n]
    return ", ".join(repr(i) for i in shown) + (
        f", ... {len(ids) - n} more" if len(ids) > n else ""
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


@contextlib.contextmanager
def _lock(rundir: RunDir) -> Iterator[None]:
    path = rundir.path / ".lock"
    with open(path, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as e:
            f.seek(0)
            holder = f.read().strip() or "another process"
            raise RunLocked(
                f"{rundir.path} is being run by {holder} (lock {path}); wait for it to finish or"
                " stop it: a stopped or killed run releases the lock, and a rerun continues"
            ) from e
        f.seek(0)
        f.truncate()
        f.write(f"jobrunner pid {os.getpid()} on {socket.gethostname()}")
        f.flush()
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
