"""Opening a run directory: lock it, check it holds this job, and find what is left to do.

Runs before any model is loaded: duplicate ids and a changed job are refused here.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
from collections.abc import Iterator

from jobrunner.config import JobConfig, fingerprint
from jobrunner.errors import InputDataError, ResumeMismatch, RunLocked
from jobrunner.io.readers import RawRow, input_files, read_rows
from jobrunner.io.rundir import Manifest, RunDir

MAX_DUPLICATES_LISTED = 10


def job_fingerprint(cfg: JobConfig) -> dict:
    parts = cfg.fingerprint_parts()
    files = input_files(cfg.input.path)
    parts["input"] = [[os.path.relpath(f), os.path.getsize(f)] for f in files]
    return {k: fingerprint(v) for k, v in parts.items()}


@contextlib.contextmanager
def open_run(rundir: RunDir, cfg: JobConfig, opts) -> Iterator[tuple[Manifest, set[str], int]]:
    """Yields (manifest, ids already terminal, input rows). Holds the run lock meanwhile."""
    rundir.path.mkdir(parents=True, exist_ok=True)
    with _lock(rundir):
        if opts.restart:
            _clear(rundir)
        total, duplicates = scan_ids(cfg)
        if duplicates:
            raise InputDataError(_describe_duplicates(duplicates))
        manifest = rundir.prepare()
        _check_fingerprint(rundir, manifest, job_fingerprint(cfg))
        if opts.retry_errors:
            _forget_errors(rundir, manifest)
        rundir.save_manifest(manifest)
        yield manifest, rundir.committed_ids(), total


def scan_ids(cfg: JobConfig) -> tuple[int, dict[str, list[str]]]:
    """Count rows and find duplicate ids (with where each occurs), reading ids only."""
    from jobrunner.prep.prepare import make_preparer

    preparer = make_preparer(cfg, tokenizer=None)
    first_seen: dict[str, str] = {}
    duplicates: dict[str, list[str]] = {}
    total = 0
    for item in read_rows(cfg.input.path, cfg.input.format, cfg.input.batch_rows):
        total += 1
        if not isinstance(item, RawRow):
            continue
        row_id = preparer.row_id(item)
        if not isinstance(row_id, str):
            continue
        if row_id in first_seen:
            duplicates.setdefault(row_id, [first_seen[row_id]]).append(str(item.source))
        else:
            first_seen[row_id] = str(item.source)
    return total, duplicates


def _describe_duplicates(duplicates: dict[str, list[str]]) -> str:
    shown = list(duplicates.items())[:MAX_DUPLICATES_LISTED]
    lines = [f"  id {k!r} at {', '.join(v)}" for k, v in shown]
    more = len(duplicates) - len(shown)
    tail = [f"  ... and {more} more"] if more > 0 else []
    return "\n".join([f"{len(duplicates)} duplicate ids in the input (ids must be unique):",
                      *lines, *tail])


def _check_fingerprint(rundir: RunDir, manifest: Manifest, fp: dict) -> None:
    if not manifest.fingerprint:
        manifest.fingerprint = fp
        return
    changed = [k for k in fp if manifest.fingerprint.get(k) != fp[k]]
    if changed:
        raise ResumeMismatch(
            f"{rundir.path} holds a different job (changed: {', '.join(changed)}); use a new"
            " output.path, or --restart to discard the earlier results")


def _forget_errors(rundir: RunDir, manifest: Manifest) -> None:
    """--retry-errors: failed rows become pending again."""
    if rundir.errors_path.exists():
        rundir.errors_path.unlink()
    manifest.errors_bytes = 0
    manifest.counts["failed"] = 0


def _clear(rundir: RunDir) -> None:
    for name in ("results", "errors.jsonl", "manifest.json", "_SUCCESS", "report.json", "report.md",
                 "output.jsonl", "batch.json"):
        p = rundir.path / name
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()


@contextlib.contextmanager
def _lock(rundir: RunDir) -> Iterator[None]:
    path = rundir.path / ".lock"
    with open(path, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as e:
            f.seek(0)
            holder = f.read().strip() or "another process"
            raise RunLocked(f"{rundir.path} is being run by {holder}; wait for it or stop it") from e
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()}")
        f.flush()
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
