"""The run directory on an object store (s3://, gs://, ...): no rename, so commits are records.

Layout under the output URL:
  results/part-NNNNN-<run>.parquet   one complete object per commit (one PUT or one completed
                                     multipart upload: never visible in part)
  errors/errors-NNNNN-<run>.jsonl    that commit's row errors, one object per commit
  commits/NNNNNNNNNN.json            the commit records, numbered 0, 1, 2, ...
  manifest.json, _SUCCESS, report.*, telemetry/   written after the records, for people and tools

A commit writes its shard and its error object under names no other run uses, then creates the
next commit record with a conditional write (If-None-Match: *). The records are the truth: a
shard or error object that no record lists (a commit that failed or was killed before its
record) is ignored, and deleted when the run succeeds. Two runs on one prefix cannot both append
the same record number, so one history of commits exists: a run that loses the race stops
(RunLocked) before it commits anything, and every row is committed exactly once.

On a store without conditional writes (see fs.CONDITIONAL_CREATE) the record is written
unconditionally after an existence check: one run at a time per prefix is then the user's promise,
and a warning says so. Side files (reports, telemetry, the lock) are written to a local staging
directory, `path`, and uploaded by `publish`.

--retry-errors (`forget_failed`) makes the failed rows pending again by one record, so a row is
in one state at every point (failed, or pending) and never in two:
  1. DELETE _SUCCESS: no marker may stand beside records that leave rows pending;
  2. PUT, for each listed shard holding failed rows, its other rows as a new object
     `part-NNNNN-<run>-KKKKK` (none where every row failed): listed by no record yet, so unread;
  3. create record NNNNN (conditional, as a commit's): `retry.replaced` maps each such shard's
     name to its new entry (or null), and applying it also empties the error list; it carries
     the manifest, no longer finished, its `retired_cost_usd` raised by the dropped rows' cost;
  4. PUT manifest.json; DELETE errors.jsonl (assembled again from the records when the run
     ends), the replaced shards and the old errors/ objects.
A kill before the record of 3 leaves the records as they were (a run that had _SUCCESS is
unfinished without it, and a plain rerun finishes it again as it was; one that ended 65 still
answers 65; a --retry-errors starts over; the objects of 2 are garbage); a kill after it leaves
the failed rows pending, which any rerun runs (what 4 would delete is garbage; errors.jsonl,
stale until the run ends, is written anew then). Garbage is what no record lists: never read,
deleted when the run ends, whatever its outcome. A run that committed since the
retry read the records takes its record number first: the retry stops (RunLocked).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from jobrunner.errors import RunDirError, RunLocked, StoreError
from jobrunner.formats import FORMATS
from jobrunner.io.failed_rows import without_failed
from jobrunner.io.fs import (
    CONDITIONAL_CREATE,
    bucket_word,
    filesystem,
    missing_bucket,
    scheme,
)
from jobrunner.io.identity import ROWS_FILE, RUN_FOLDERS, RUN_OBJECT
from jobrunner.io.ids import IdSet, hash_ids
from jobrunner.io.row_ranges import CommittedRows
from jobrunner.io.rundir import (
    OWN_FOLDER_FILES,
    ErrorPlaces,
    Manifest,
    fault,
    not_a_run,
    split_unwritable,
    succeeded_in,
)
from jobrunner.io.store_errors import from_store_error
from jobrunner.types import RowError

log = logging.getLogger(__name__)
# Tests only: `JOBRUNNER_FAULT_PUT=errors:2` fails the PUT of that object in the 2nd commit
# (objects: shard, errors, record; a --retry-errors is its process's first commit, and PUTs
# retry_shard and record). rundir.FAULT_ENV kills at retry_unmarked, retry_shards, retry_record.
FAULT_PUT_ENV = "JOBRUNNER_FAULT_PUT"
STAGING_ENV = "JOBRUNNER_STAGING_DIR"  # where store runs keep side files (staging_dir)


class StoreRunDir:
    """RunDir's interface over an fsspec store (module doc)."""

    def __init__(
        self,
        url: str,
        fmt: str = "parquet",
        error_record: Callable[[RowError], dict[str, Any]] | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.fs, self.root = filesystem(self.url)
        self.fmt = fmt
        self.error_record = error_record or RowError.to_json
        self.conditional = scheme(self.url) in CONDITIONAL_CREATE
        self.path = staging_dir(self.url)
        self.token = uuid.uuid4().hex[:8]  # names this run's objects: never another run's
        self._shards: list[dict[str, Any]] = []  # {name, rows, failed} in commit order
        self._errors: list[dict[str, Any]] = []  # {name, lines}
        self._seq = -1  # the last commit record this process has read or written
        self._head: dict[str, Any] | None = None  # the manifest of the last record holding one
        self._error_places = ErrorPlaces()
        self._commits = 0
        self.schema: Any = None  # the run's Arrow schema (run_schema.settle), once it is open

    @property
    def location(self) -> str:
        return self.url

    def _key(self, *parts: str) -> str:
        return "/".join([self.root, *parts])

    # ----------------------------------------------------------------- state

    @property
    def finished(self) -> bool:
        """_SUCCESS, or a recorded outcome other than exit 0 (as RunDir.finished)."""
        done = self.success_marked
        if not done:
            m = self.load_manifest()
            done = m is not None and m.finished_at is not None and m.outcome.get("exit_code", 0)
        if done:  # a rerun answers from the report, which may have been made elsewhere
            self._fetch("report.json")
        return bool(done)

    @property
    def success_marked(self) -> bool:
        return self.fs.exists(self._key("_SUCCESS"))

    def unmark_success(self) -> None:
        self.fs.rm_file(self._key("_SUCCESS"))

    def _fetch(self, name: str) -> None:
        """The store's copy of a side file replaces the staging one (it may be from elsewhere)."""
        local = self.path / name
        try:
            data = self.fs.cat_file(self._key(name))
        except FileNotFoundError:
            return
        local.parent.mkdir(parents=True, exist_ok=True)
        local.write_bytes(data)

    def keep_side_file(self, name: str) -> None:
        """Upload a side file now (input_rows.parquet: a resume elsewhere explains changes)."""
        self._put(self._key(name), (self.path / name).read_bytes(), None)

    def check_ours(self) -> None:
        """The prefix holds a run (commit records) or nothing: anything else is the user's. A
        prefix inside another run's is refused too, as a local run directory inside another."""
        self._check_bucket()
        self._check_not_inside_a_run()
        if self._list("commits"):
            return
        try:
            keys = [k.rstrip("/") for k in self.fs.ls(self.root, detail=False)]
        except FileNotFoundError:
            keys = []
        # the prefix's own folder marker (a zero-byte `prefix/`, as a console's "create
        # folder" makes) is no content
        foreign = sorted(k.rsplit("/", 1)[-1] for k in keys if k != self.root)
        if foreign:
            raise not_a_run(self.url, "no commits/", foreign, "under an empty prefix")

    def _check_bucket(self) -> None:
        """A bucket that does not exist is refused before any work, not at the first write."""
        bucket = missing_bucket(self.url)
        if bucket:
            raise RunDirError(
                f"output.path {self.url}: {bucket_word(self.url)} {bucket} does not exist (or"
                " these credentials cannot see it): create it or choose another output.path"
            )

    def _check_not_inside_a_run(self) -> None:
        """One listing a level up to the bucket: a prefix above holding commit records."""
        parts = self.root.split("/")
        for n in range(len(parts) - 1, 0, -1):
            above = "/".join(parts[:n])
            try:
                records = self.fs.ls(f"{above}/commits", detail=False)
            except FileNotFoundError:
                continue
            if records:
                head = self.url[: len(self.url) - len(self.root)]
                where = head + above if self.url.endswith(self.root) else above
                raise RunDirError(
                    f"output.path {self.url} is inside the run directory {where}: a run"
                    " directory holds one run's files only. Choose an output.path outside it"
                )

    def check_finished(self, m: Manifest) -> bool:
        """A finished run's recorded shards are all in the store (one listing); False when one
        is gone, so its rows run again. Objects are written once under their final names, and
        those no record lists were removed when the run finished."""
        present = {k.rsplit("/", 1)[-1] for k in self._list("results")}
        return all(s["name"] in present for s in m.shards)

    @property
    def has_errors(self) -> bool:
        self._read_records()
        return any(e["lines"] for e in self._errors)

    def load_manifest(self) -> Manifest | None:
        head = self._read_records()
        return None if head is None else self._manifest(head)

    def prepare(self) -> Manifest:
        """Read the commit records: the shards and errors they list are the committed state."""
        if not self.conditional:
            log.warning(
                "%s: this store has no conditional writes; run one job at a time on this prefix"
                " (DESIGN.md, object stores)",
                self.url,
            )
        self.path.mkdir(parents=True, exist_ok=True)
        m = self.load_manifest()
        if m is None:  # a new run: nothing staged here belongs to it (an earlier run's files)
            self._clear_staging()
            m = Manifest(started_at=time.time())
        else:
            self._fetch(ROWS_FILE)
        self._error_places = ErrorPlaces(self.iter_errors())
        return m

    def recount(self, m: Manifest) -> None:
        m.shards = [{"name": s["name"], "rows": s["rows"]} for s in self._shards]
        m.counts["succeeded"] = sum(s["rows"] - s["failed"] for s in self._shards)
        m.counts["failed"] = sum(e["lines"] for e in self._errors)
        m.errors_bytes = 0

    def shard_files(self) -> list[str]:
        """URLs of the committed shards, in commit order."""
        self._read_records()
        return [f"{self.url}/results/{s['name']}" for s in self._shards]

    def committed_idset(self) -> IdSet:
        from jobrunner.io.rundir import read_id_array

        chunks = [hash_ids(read_id_array(f)) for f in self.shard_files()]
        errors = [str(e["id"]) for e in self.iter_errors() if e.get("id") is not None]
        return IdSet.from_chunks([*chunks, hash_ids(errors) if errors else []])

    def committed_rows(self) -> CommittedRows:
        """No row ranges on a store (io/row_ranges.py): the ids decide every row."""
        return CommittedRows()

    def succeeded_ids(self) -> set[str]:
        """Ids of committed rows that did not fail (--retry-errors on a changed input)."""
        return succeeded_in(self.shard_files())

    def committed_ids(self) -> set[str]:
        from jobrunner.io.rundir import read_column

        ids = {r for f in self.shard_files() for r in read_column(f, "id")}
        ids.update(str(e["id"]) for e in self.iter_errors() if e.get("id") is not None)
        return ids

    def iter_errors(self) -> Iterator[dict[str, Any]]:
        for e in self._errors:
            data = self.fs.cat_file(self._key("errors", e["name"]))
            for line in data.decode("utf-8").splitlines():
                if line.strip():
                    yield json.loads(line)

    # ---------------------------------------------------------------- commit

    def save_manifest(self, m: Manifest) -> None:
        """A record holding the manifest: claims the next number, so a concurrent run stops."""
        self.recount(m)
        self._append({"manifest": _head_fields(m)})
        self._put(self._key("manifest.json"), json.dumps(m.to_json(), indent=1).encode(), None)

    def commit(
        self,
        m: Manifest,
        records: list[dict[str, Any]],
        errors: list[RowError],
        sources: list[Any] | None = None,
    ) -> None:
        """The errors object, the shard, then the record that lists them (module doc)."""
        self._commits += 1
        n = self._seq + 1
        shard = None
        if records:
            shard, records, failed = self._encode_shard(records, sources)
            errors = [*errors, *failed]
        errors = self._error_places.new(errors)
        entry: dict[str, Any] = {}
        if errors:
            lines = "".join(
                json.dumps(self.error_record(e), ensure_ascii=False) + "\n" for e in errors
            )
            name = f"errors-{n:05d}-{self.token}.jsonl"
            self._put(self._key("errors", name), lines.encode(), "errors")
            entry["errors"] = {"name": name, "lines": len(errors)}
        fault("after_errors", self._commits)
        if shard is not None:
            name = f"part-{n:05d}-{self.token}{FORMATS.get(self.fmt).suffix}"
            self._put(self._key("results", name), shard, "shard")
            failed = sum(r["finish_reason"] == "error" for r in records)
            entry["shard"] = {"name": name, "rows": len(records), "failed": failed}
        fault("after_shard", self._commits)
        if entry:
            self._append(entry)
        self.recount(m)
        fault("after_manifest", self._commits)

    def _encode_shard(
        self, records: list[dict[str, Any]], sources: list[Any] | None
    ) -> tuple[bytes | None, list[dict[str, Any]], list[RowError]]:
        """(the shard's bytes or None, the records in it, errors for those left out)."""
        write = FORMATS.get(self.fmt).writer(self.schema)
        try:
            return _encode(records, self.fmt, write), records, []
        except OSError:
            raise
        except Exception:
            kept, failed = split_unwritable(records, self.fmt, sources, write)
        return (_encode(kept, self.fmt, write) if kept else None), kept, failed

    def _append(self, entry: dict[str, Any]) -> None:
        """Create commit record seq+1; RunLocked if another run created it first."""
        seq = self._seq + 1
        body = json.dumps({"seq": seq, "run": self.token, **entry}, sort_keys=True).encode()
        try:
            self._put(self._key("commits", f"{seq:010d}.json"), body, "record", create=True)
        except FileExistsError as e:
            self._discard(entry)
            raise RunLocked(
                f"{self.url} is being run by another jobrunner (commit {seq} was made by it);"
                " rows it committed are kept: run this job again once it has stopped"
            ) from e
        self._seq = seq
        self._apply(json.loads(body))

    def _discard(self, entry: dict[str, Any]) -> None:
        for kind, folder in (("shard", "results"), ("errors", "errors")):
            if kind in entry:
                self.fs.rm_file(self._key(folder, entry[kind]["name"]))
        for new in entry.get("retry", {}).get("replaced", {}).values():
            if new:
                self.fs.rm_file(self._key("results", new["name"]))

    def _put(self, key: str, data: bytes, what: str | None, create: bool = False) -> None:
        if what and os.environ.get(FAULT_PUT_ENV) == f"{what}:{self._commits}":
            raise StoreError(f"{self.url}: injected failure of the {what} PUT ({FAULT_PUT_ENV})")
        try:
            if create and not self.conditional and self.fs.exists(key):
                raise FileExistsError(key)
            self.fs.pipe_file(
                key, data, mode="create" if create and self.conditional else "overwrite"
            )
        except FileExistsError:
            raise
        except Exception as e:
            user = from_store_error(e, self.url)
            if user is None and not isinstance(e, OSError):
                raise
            raise user or StoreError(
                f"{self.url}: writing {key.rsplit('/', 1)[-1]} failed ({e}); the commits before"
                " it are kept: run the same command again to continue"
            ) from e

    def forget_failed(self, m: Manifest) -> int:
        """--retry-errors: failed rows become pending again, by one record (module doc).
        Returns how many there were. The state is prepare()'s: a run that committed since
        then makes the retry's record RunLocked, as it makes a commit's."""
        failed = sum(e["lines"] for e in self._errors)
        stale = [s for s in self._shards if s["failed"]]
        if not (failed or stale):
            return 0
        self._commits += 1  # a commit of this process: fault points count it
        old = [self._key("errors", e["name"]) for e in self._errors]
        self._remove(self._key("_SUCCESS"))
        fault("retry_unmarked", self._commits)
        replaced, retired = self._put_kept_rows(stale)
        fault("retry_shards", self._commits)
        m.finished_at, m.outcome = None, {}
        m.retired_cost_usd += retired
        self._append({"retry": {"replaced": replaced}, "manifest": _head_fields(m)})
        fault("retry_record", self._commits)
        self._error_places = ErrorPlaces()
        self.recount(m)
        self._put(self._key("manifest.json"), json.dumps(m.to_json(), indent=1).encode(), None)
        for key in [self._key("errors.jsonl"), *(self._key("results", s["name"]) for s in stale)]:
            self._remove(key)
        for key in old:
            self._remove(key)
        return failed

    def _put_kept_rows(self, stale: list[dict[str, Any]]) -> tuple[dict[str, Any], float]:
        """Step 2 of a retry: ({old name: new entry or None}, the failed rows' cost)."""
        n, suffix = self._seq + 1, FORMATS.get(self.fmt).suffix
        replaced: dict[str, Any] = {}
        retired = 0.0
        for k, s in enumerate(stale):
            kept = without_failed(self._read_listed(s["name"]), suffix)
            retired += kept.failed_cost_usd
            replaced[s["name"]] = None
            if kept.data is not None:
                name = f"part-{n:05d}-{self.token}-{k:05d}{suffix}"
                self._put(self._key("results", name), kept.data, "retry_shard")
                replaced[s["name"]] = {"name": name, "rows": kept.rows, "failed": 0}
        return replaced, retired

    def _read_listed(self, name: str) -> bytes:
        """A listed shard's bytes. Gone: another run's retry replaced it (a record came after
        the last one read: RunLocked), or someone deleted it."""
        try:
            return self.fs.cat_file(self._key("results", name))
        except FileNotFoundError as e:
            self.fs.invalidate_cache(self._key("commits"))
            later = [k for k in self._list("commits") if _seq(k) > self._seq]
            if later:
                raise RunLocked(
                    f"{self.url} is being run by another jobrunner (commit {_seq(min(later))}"
                    " was made by it); run this job again once it has stopped"
                ) from e
            raise RunDirError(
                f"{self.url}/results/{name}, a shard the run's commit records list, is gone:"
                " its rows are lost; --restart to run the job again"
            ) from e

    def _remove(self, key: str) -> None:
        """DELETE `key`; gone already is fine (a retry after a crash deletes it again)."""
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm_file(key)

    def mark_finished(self, m: Manifest, exit_code: int, message: str = "") -> None:
        """Every row has its final state: errors.jsonl (a run over its error budget ends 65
        naming it), then the record saying so; a kill between them leaves the run unfinished,
        so the next run finishes it again. The objects of failed commits are deleted."""
        self._write_errors_file()
        m.finished_at = time.time()
        m.outcome = {"exit_code": exit_code, "message": message}
        self.save_manifest(m)
        self._collect_garbage()

    def mark_success(self, m: Manifest | None = None) -> None:
        """_SUCCESS, after mark_finished (errors.jsonl, garbage collected); a run finished by
        a jobrunner that assembled errors.jsonl only here gets it now."""
        m = m or self.load_manifest() or Manifest()
        if m.finished_at is None:
            self.mark_finished(m, 0)
        elif self._errors and not self.fs.exists(self._key("errors.jsonl")):
            self._write_errors_file()
        self._put(self._key("_SUCCESS"), b"", None)

    def _write_errors_file(self) -> None:
        """errors.jsonl, every commit's errors in one object, as a local run has it (none
        where no row failed: a retry's stale one goes)."""
        if not self._errors:
            self._remove(self._key("errors.jsonl"))
            return
        with self.fs.open(self._key("errors.jsonl"), "wb") as out:
            for e in self._errors:
                out.write(self.fs.cat_file(self._key("errors", e["name"])))

    def _collect_garbage(self) -> None:
        """Objects of failed commits: listed by no record, never read; gone once the run is done."""
        listed = {s["name"] for s in self._shards} | {e["name"] for e in self._errors}
        for folder in ("results", "errors"):
            for key in self._list(folder):
                if key.rsplit("/", 1)[-1] not in listed:
                    self.fs.rm_file(key)

    def publish(self) -> None:
        """Upload the side files written to the staging directory (reports, telemetry)."""
        for f in sorted(self.path.rglob("*")):
            rel = f.relative_to(self.path).as_posix()
            if f.is_file() and not rel.startswith("."):
                self.fs.pipe_file(self._key(rel), f.read_bytes())

    def clear(self) -> None:
        """--restart: the run's objects go, as a local run's files do; an object of the user's
        under the prefix is refused first (78), so nothing is half removed. The prefix itself
        stays, and so does the bucket of a run at a bucket's root."""
        keys = [k for k in self.fs.find(self.root) if k.rstrip("/") != self.root]
        foreign = [k for k in keys if not _run_object(k[len(self.root) :])]
        if foreign:
            shown = ", ".join(f"{self.url}{k[len(self.root) :]}" for k in foreign[:5])
            more = f", ... {len(foreign) - 5} more" if len(foreign) > 5 else ""
            raise RunDirError(
                f"--restart removes only the objects a run wrote, and {shown}{more} is not one:"
                " move it out of the run's prefix and run again (nothing was removed)"
            )
        if keys:
            self.fs.rm(keys)
        self._shards, self._errors, self._seq, self._head = [], [], -1, None
        self._clear_staging()
        (self.path / "estimate.json").unlink(missing_ok=True)  # the earlier job's, as locally

    def _clear_staging(self) -> None:
        import shutil

        for p in self.path.iterdir():
            if p.name in (".lock", ".report.lock", "estimate.json"):  # locks; `estimate`'s
                continue
            shutil.rmtree(p) if p.is_dir() else p.unlink()

    # ---------------------------------------------------------------- records

    def _read_records(self) -> dict[str, Any] | None:
        """Apply the records after the last one read; returns the last manifest record."""
        keys = [k for k in self._list("commits") if _seq(k) > self._seq]
        if keys:
            for _, data in sorted(self.fs.cat(keys).items(), key=lambda kv: _seq(kv[0])):
                rec = json.loads(data)
                if rec["seq"] != self._seq + 1:
                    break  # a gap: a record still being written; read up to it
                self._apply(rec)
                self._seq = rec["seq"]
        return self._head

    def _apply(self, rec: dict[str, Any]) -> None:
        if "retry" in rec:  # the shards it replaced, the errors it forgot (module doc)
            replaced = rec["retry"]["replaced"]
            kept = [replaced.get(s["name"], s) for s in self._shards]
            self._shards, self._errors = [s for s in kept if s], []
        if "shard" in rec:
            self._shards.append(rec["shard"])
        if "errors" in rec:
            self._errors.append(rec["errors"])
        if "manifest" in rec:
            self._head = rec["manifest"]

    def _manifest(self, head: dict[str, Any]) -> Manifest:
        m = Manifest(**{k: v for k, v in head.items() if k in Manifest.__dataclass_fields__})
        self.recount(m)
        return m

    def _list(self, folder: str) -> list[str]:
        try:
            return self.fs.ls(self._key(folder), detail=False)
        except FileNotFoundError:
            return []


def staging_dir(url: str) -> Path:
    """The local directory for a store run's side files (one per URL and machine):
    under $JOBRUNNER_STAGING_DIR, else $XDG_CACHE_HOME/jobrunner/runs."""
    base = os.environ.get(STAGING_ENV) or Path(
        os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache", "jobrunner", "runs"
    )
    return Path(base) / hashlib.sha256(url.encode()).hexdigest()[:16]


def _head_fields(m: Manifest) -> dict[str, Any]:
    return {k: v for k, v in m.to_json().items() if k != "shards"}


def _encode(records: list[dict[str, Any]], fmt: str, write: Callable) -> bytes:
    """A shard's bytes (`write`: the run's shard writer): written locally first, so the store
    gets one complete object."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="jobrunner-shard-") as d:
        tmp = Path(d) / f"shard{FORMATS.get(fmt).suffix}"
        write(records, tmp)
        return tmp.read_bytes()


# A store run's own folders besides a local run's (rundir.OWN_FOLDER_FILES)
STORE_FOLDER_FILES: dict[str, Callable[[str], bool]] = {
    "errors": lambda name: re.fullmatch(r"errors-\d+-[\w-]+\.jsonl", name) is not None,
    "commits": lambda name: re.fullmatch(r"\d{10}\.json", name) is not None,
}


def _run_object(rel: str) -> bool:
    """Whether `rel` (a key below the run's prefix, from its "/") is one a run writes (named
    as rundir.clear takes a local run's files), or one of its folders' markers (a zero-byte
    `results/`, as a console's "create folder" makes)."""
    parts = rel.strip("/").split("/")
    if len(parts) == 1:
        return parts[0] in RUN_FOLDERS or RUN_OBJECT.fullmatch(rel) is not None
    ours = {**OWN_FOLDER_FILES, **STORE_FOLDER_FILES}.get(parts[0])
    return len(parts) == 2 and ours is not None and ours(parts[1])


def _seq(key: str) -> int:
    name = key.rsplit("/", 1)[-1]
    return int(name.split(".")[0]) if name.split(".")[0].isdigit() else -1


def open_rundir(
    path: str | Path,
    fmt: str = "parquet",
    error_record: Callable[[RowError], dict[str, Any]] | None = None,
):
    """The run directory at `path`: a local RunDir, or a StoreRunDir for a store URL."""
    from jobrunner.io.fs import is_remote, local_path
    from jobrunner.io.rundir import RunDir

    if not is_remote(str(path)):
        return RunDir(local_path(str(path)), fmt, error_record)
    from jobrunner.errors import ConfigError

    if fmt not in ("parquet", "jsonl") or error_record is not None:
        raise ConfigError(f"output.path {path}: object stores take output.format parquet or jsonl")
    return StoreRunDir(str(path), fmt, error_record)
