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
import shutil
import socket
from collections.abc import Iterator

from jobrunner.config import JobConfig, fingerprint
from jobrunner.errors import InputDataError, ResumeMismatch, RunLocked
from jobrunner.formats import input_files, make_preparer, read_rows
from jobrunner.io.readers import RawRow
from jobrunner.io.rundir import Manifest, RunDir

MAX_DUPLICATES_LISTED = 10
log = logging.getLogger(__name__)


def job_parts(cfg: JobConfig) -> dict:
    """The settings that make two runs the same job (hashed into the fingerprint)."""
    parts = cfg.fingerprint_parts()
    files = input_files(cfg.input.path)
    parts["input"] = [[os.path.relpath(f), os.path.getsize(f)] for f in files]
    return json.loads(json.dumps(parts, default=str))


def job_fingerprint(cfg: JobConfig) -> dict:
    return {k: fingerprint(v) for k, v in job_parts(cfg).items()}


@contextlib.contextmanager
def open_run(rundir: RunDir, cfg: JobConfig, opts) -> Iterator[tuple[Manifest, set[str], int]]:
    """Yields (manifest, ids already terminal, input rows). Holds the run lock meanwhile."""
    rundir.path.mkdir(parents=True, exist_ok=True)
    with _lock(rundir):
        if opts.restart:
            _clear(rundir)
        total, duplicates = scan_ids(cfg)
        if duplicates:
            raise InputDataError(describe_duplicates(duplicates))
        manifest = rundir.prepare()
        _check_fingerprint(rundir, manifest, job_parts(cfg))
        if opts.retry_errors:
            log.info(
                "--retry-errors: %d failed rows will run again", rundir.forget_failed(manifest)
            )
        rundir.save_manifest(manifest)
        yield manifest, rundir.committed_ids(), total


def check_same_job(rundir: RunDir, cfg: JobConfig) -> None:
    """A finished run directory answers only its own job: raise ResumeMismatch otherwise."""
    manifest = rundir.load_manifest()
    if manifest is not None and manifest.fingerprint:
        _check_fingerprint(rundir, manifest, job_parts(cfg))


def scan_ids(cfg: JobConfig) -> tuple[int, dict[str, list[str]]]:
    """Count rows and find duplicate ids with where each occurs, reading ids only.

    Holds one 8-byte hash per id; only ids whose hashes meet are read again, with their places.
    """
    seen: set[int] = set()
    suspects: set[int] = set()
    total = 0
    for row_id, _ in _iter_ids(cfg):
        total += 1
        h = _id_hash(row_id) if row_id is not None else None
        if h is not None:
            (suspects if h in seen else seen).add(h)
    if not suspects:
        return total, {}
    seen.clear()
    places: dict[str, list[str]] = {}
    for row_id, item in _iter_ids(cfg):
        if row_id is not None and _id_hash(row_id) in suspects:
            places.setdefault(row_id, []).append(str(item.source))
    return total, {k: v for k, v in places.items() if len(v) > 1}


def _iter_ids(cfg: JobConfig) -> Iterator[tuple[str | None, object]]:
    """(id, item) for every input item; None where the row has no valid id."""
    preparer = make_preparer(cfg, tokenizer=None)
    for item in read_rows(cfg.input.path, cfg.input.format, cfg.input.batch_rows):
        row_id = preparer.row_id(item) if isinstance(item, RawRow) else None
        yield (row_id if isinstance(row_id, str) else None), item


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


def _check_fingerprint(rundir: RunDir, manifest: Manifest, parts: dict) -> None:
    fp = {k: fingerprint(v) for k, v in parts.items()}
    if not manifest.fingerprint:
        manifest.fingerprint, manifest.job = fp, parts
        return
    changed = [k for k in fp if manifest.fingerprint.get(k) != fp[k]]
    if changed:
        lines = [d for k in changed for d in _diff(k, manifest.job.get(k), parts[k])]
        raise ResumeMismatch(
            f"{rundir.path} holds a different job; changed since it started:\n"
            + "\n".join(f"  {d}" for d in lines[:MAX_DUPLICATES_LISTED])
            + "\nrun the earlier job file again to continue it, use a new output.path,"
            " or --restart to discard the earlier results"
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
    if key == "input":
        return [f"input: the input files or their sizes ({len(old)} files before, {len(new)} now)"]
    return [f"{key}: {old!r} -> {new!r}"]


def _clear(rundir: RunDir) -> None:
    for name in (
        "results",
        "errors.jsonl",
        "manifest.json",
        "_SUCCESS",
        "report.json",
        "report.md",
        "output.jsonl",
        "batch.json",
    ):
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
