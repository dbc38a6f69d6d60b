"""The run directory (DESIGN.md): committed shards, errors.jsonl, manifest.json, _SUCCESS.

Commit order, which makes any crash point safe:
  1. append the batch's error lines to errors.jsonl (fsync);
  2. write the result shard under a temporary name, fsync, rename into results/ (first
     removing any rows/ file of its name), then write rows/<shard>, its input row ranges
     (io/row_ranges.py: a crash before it only leaves those rows to the id check);
  3. replace manifest.json atomically, recording the shard and errors.jsonl's committed length.
On resume (`prepare`), the files are the truth and the manifest is rebuilt from them:
  - a shard in results/ that the manifest does not list means the last commit got past step 2,
    so its step 1 is complete too: both are kept (step 3 is redone);
  - otherwise errors.jsonl is cut back to the manifest's `errors_bytes` (step 1 without 2 is
    redone with the rows of its batch);
  - temporary files are removed, and shard list and counts are recounted from the files.
Every visible shard is complete (renamed after fsync), so nothing is lost and nothing counted
twice, wherever a crash falls.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobrunner.errors import RunDirError
from jobrunner.formats import FORMATS
from jobrunner.io import row_ranges
from jobrunner.io.failed_rows import without_failed
from jobrunner.io.fs import open_file
from jobrunner.io.identity import is_run_dir
from jobrunner.io.ids import IdSet, hash_ids
from jobrunner.io.writers import (
    fsync_dir,
    fsync_file,
    naming,
    publish,
    unwritable,
    write_atomic,
    write_temp,
    write_text_atomic,
)
from jobrunner.types import RowError

MANIFEST_VERSION = 2  # 2: the input is named by content (io/identity.py)
# What runs write into a run directory; --restart removes these and nothing else.
OWN_FILES = (
    "results",
    "rows",  # io/row_ranges.py
    "errors.jsonl",
    "manifest.json",
    "input_rows.parquet",
    "_SUCCESS",
    "report.json",
    "report.md",
    "report.html",
    "metrics.prom",
    "telemetry",
    "ray-errors",
    "output.jsonl",
    "batch.json",
    "estimate.json",  # `jobrunner estimate`'s, for the job the directory held
)
# What runs write inside the folders above; --restart refuses anything else there (the user's).
OWN_FOLDER_FILES: dict[str, Callable[[str], bool]] = {
    "results": lambda name: is_shard_name(name),
    "rows": lambda name: is_shard_name(name),  # io/row_ranges.py: one file per shard, its name
    "telemetry": lambda name: name in {"device.parquet", "steps.parquet", "rows.parquet"},
    "ray-errors": lambda name: name.endswith(".jsonl"),  # executors/ray_blocks.py fragments
}
# Present in a directory before its first manifest: a run that stopped before writing one.
BEFORE_MANIFEST = {".lock", ".report.lock", "results", "input_rows.parquet", "estimate.json"}
SHARD_NAME = re.compile(r"part-[A-Za-z0-9-]+(\.[a-z0-9]+)")  # and a shard format's suffix


def is_shard_name(name: str) -> bool:
    m = SHARD_NAME.fullmatch(name)
    return bool(m) and any(m[1] == f.suffix for f in FORMATS.values() if f.suffix)


TEMP_NAME = re.compile(r"\..+\.tmp\d*")
# Tests only: `JOBRUNNER_FAULT_KILL=after_errors:2` SIGKILLs this process at that point of the
# 2nd commit (points: after_errors, after_shard, after_manifest).
FAULT_ENV = "JOBRUNNER_FAULT_KILL"


@dataclass
class Manifest:
    fingerprint: dict[str, Any] = field(default_factory=dict)
    shards: list[dict[str, Any]] = field(default_factory=list)  # {name, rows, bytes}
    errors_bytes: int = 0
    counts: dict[str, int] = field(default_factory=dict)  # succeeded, failed, skipped
    started_at: float = 0.0
    finished_at: float | None = None
    runs: list[dict[str, Any]] = field(default_factory=list)  # one record per invocation
    version: int = MANIFEST_VERSION
    job: dict[str, Any] = field(default_factory=dict)  # the fingerprinted settings, to diff
    outcome: dict[str, Any] = field(default_factory=dict)  # at the end: exit_code, message
    retired_cost_usd: float = 0.0  # paid for failed attempts that --retry-errors ran again
    retiring_cost_usd: float = 0.0  # ... being retired (a --retry-errors in progress)
    schema: dict[str, Any] = field(default_factory=dict)  # every shard's columns (run_schema.py)

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


class RunDir:
    def __init__(
        self,
        path: str | Path,
        fmt: str = "parquet",
        error_record: Callable[[RowError], dict[str, Any]] | None = None,
    ) -> None:
        self.path = Path(path)
        self.fmt = fmt  # the shards' format
        self.shards = FORMATS.get(fmt)
        self.error_record = error_record or RowError.to_json  # the output format's line shape
        self.results = self.path / "results"
        self.manifest_path = self.path / "manifest.json"
        self.errors_path = self.path / "errors.jsonl"
        self.success_path = self.path / "_SUCCESS"
        self._error_places = ErrorPlaces()
        self._commits = 0
        self.schema: Any = None  # the run's Arrow schema (run_schema.settle), once it is open

    @property
    def write(self) -> Callable[[list[dict[str, Any]], Path], None]:
        """The shard writer, typed by the run's schema where the format takes one."""
        return self.shards.writer(self.schema)

    # ----------------------------------------------------------------- state

    @property
    def location(self) -> str:
        return str(self.path)

    def publish(self) -> None:
        """Side files are written in place (a store run directory uploads them here)."""

    def keep_side_file(self, name: str) -> None:
        """`path / name` is the run directory's own file already (a store uploads it)."""

    def check_ours(self) -> None:
        check_ours(self)

    def clear(self) -> None:
        """--restart: remove what runs write (check_ours made sure the directory is a run's).
        A file of the user's among them is refused first (78), so nothing is half removed."""
        foreign = [
            p
            for folder, ours in OWN_FOLDER_FILES.items()
            if (self.path / folder).is_dir()
            for p in sorted((self.path / folder).iterdir())
            if not (p.is_file() and (ours(p.name) or TEMP_NAME.fullmatch(p.name)))
        ]
        if foreign:
            shown = ", ".join(str(p) for p in foreign[:5])
            more = f", ... {len(foreign) - 5} more" if len(foreign) > 5 else ""
            raise RunDirError(
                f"--restart removes only the files a run wrote, and {shown}{more} is not one:"
                f" move it out of {foreign[0].parent.name}/ and run again (nothing was removed)"
            )
        for name in OWN_FILES:
            p = self.path / name
            if p.is_dir():
                shutil.rmtree(p)
            elif p.exists():
                p.unlink()

    @property
    def success_marked(self) -> bool:
        return self.success_path.is_file()

    def unmark_success(self) -> None:
        """A lowered input.max_error_rate: the finished job no longer passes."""
        self.success_path.unlink(missing_ok=True)

    @property
    def finished(self) -> bool:
        """_SUCCESS (exit 0), or an outcome of exit 65 recorded (over input.max_error_rate).

        A run stopped between recording an exit-0 outcome and _SUCCESS is not finished: its
        rerun goes through the pipeline, finds nothing left to generate and finishes it."""
        if self.success_path.is_file():
            return True
        m = self.load_manifest()
        return m is not None and m.finished_at is not None and m.outcome.get("exit_code", 0) != 0

    @property
    def has_errors(self) -> bool:
        return self.errors_path.is_file() and self.errors_path.stat().st_size > 0

    def load_manifest(self) -> Manifest | None:
        if not self.manifest_path.is_file():
            return None
        try:
            data = json.loads(self.manifest_path.read_text(encoding="utf-8"))
            if not isinstance(data, dict):
                raise ValueError(f"a JSON {type(data).__name__}, not an object")
            keep = {k: v for k, v in data.items() if k in Manifest.__dataclass_fields__}
            return Manifest(**keep)
        except (ValueError, TypeError) as e:  # UnicodeDecodeError is a ValueError
            raise RunDirError(
                f"{self.manifest_path} is damaged ({e}): it records which job this directory"
                " holds. Restore it from a backup, or --restart (or a new output.path) to"
                " start the job over"
            ) from e

    def save_manifest(self, m: Manifest) -> None:
        write_text_atomic(self.manifest_path, json.dumps(m.to_json(), indent=1, sort_keys=True))

    def prepare(self) -> Manifest:
        """Create the layout and recover from a crash at any point of a commit (module doc)."""
        self.results.mkdir(parents=True, exist_ok=True)
        m = self.load_manifest() or Manifest(started_at=time.time())
        rows = self.path / row_ranges.ROWS_DIR
        for stale in [
            *self.results.glob(".*.tmp*"),
            *self.path.glob(".*.tmp*"),
            *rows.glob(".*.tmp*"),
        ]:
            stale.unlink(missing_ok=True)
        self._check_results()
        listed = {s["name"] for s in m.shards}
        adopt = any(p.name not in listed for p in self.shard_files())
        self._cut_errors(None if adopt else m.errors_bytes)
        self.recount(m)  # reads every shard: a damaged one is named here
        self._settle_retired(m)
        if adopt:  # saved at once: the error lines of a later commit that crashes before its
            self.save_manifest(m)  # shard are then cut by the next recovery, not adopted too
        return m

    def recount(self, m: Manifest) -> None:
        """Shard list, row counts and errors_bytes from the files themselves."""
        m.shards, succeeded = [], 0
        for f in self.shard_files():
            rows, failed = self._read_checked(f, None)
            m.shards.append({"name": f.name, "rows": rows, "bytes": f.stat().st_size})
            succeeded += rows - failed
        self._error_places = ErrorPlaces(self.iter_errors())
        m.counts["succeeded"] = succeeded
        m.counts["failed"] = sum(1 for _ in self.iter_errors())
        m.errors_bytes = self.errors_path.stat().st_size if self.errors_path.exists() else 0

    def _cut_errors(self, size: int | None) -> None:
        """Cut errors.jsonl to `size` bytes (None: only a torn last line)."""
        if not self.errors_path.exists():
            return
        data = self.errors_path.read_bytes()
        keep = len(data) if size is None else min(size, len(data))
        keep = data.rfind(b"\n", 0, keep) + 1  # never keep a partial line
        if keep < len(data):
            with open(self.errors_path, "r+b") as f:
                f.truncate(keep)
                os.fsync(f.fileno())

    def check_finished(self, m: Manifest) -> bool:
        """A finished run's results/ as it recorded them, by a stat per shard (nothing read):
        a stray file or a shard whose size changed is named (78); False when a recorded shard
        is gone, so its rows run again. Shards recorded before sizes were kept pass on name."""
        for stale in self.results.glob(".*.tmp*"):  # a commit's, torn by a crash: never a row
            stale.unlink(missing_ok=True)
        self._check_results()
        listed = {s["name"]: s.get("bytes") for s in m.shards}
        on_disk = {p.name: p.stat().st_size for p in self.shard_files()}
        for name, size in on_disk.items():
            if name not in listed:
                raise RunDirError(
                    f"{self.results / name} is not a shard this finished run committed: move it"
                    " out of results/ and run again"
                )
            if listed[name] is not None and listed[name] != size:
                raise RunDirError(
                    f"{self.results / name} changed after it was committed ({size} bytes, "
                    f"{listed[name]} when written): restore it, or move it out of results/ and"
                    " run again (its rows are generated again), or --restart"
                )
        return listed.keys() <= on_disk.keys()

    def _check_results(self) -> None:
        """results/ holds the job's shards only: anything else is named, never read as rows."""
        for p in sorted(self.results.iterdir()):
            if not (is_shard_name(p.name) and p.is_file()):
                raise RunDirError(
                    f"{p} is not a shard of this run (results/ holds only part-*.parquet or"
                    " part-*.jsonl files that jobrunner wrote): move it out of results/ and run"
                    " again"
                )

    def _read_checked(self, shard: Path, column: str | None) -> Any:
        """A shard's column as a list; with no column, (rows, rows whose finish_reason is
        error), vectorized (count_rows)."""
        try:
            return read_column(shard, column) if column else count_rows(shard)
        except Exception as e:  # pyarrow and json raise several types for a damaged file
            raise damaged_shard(shard, e) from e

    def shard_files(self) -> list[Path]:
        return (
            sorted(p for p in self.results.iterdir() if is_shard_name(p.name))
            if self.results.is_dir()
            else []
        )

    def succeeded_ids(self) -> set[str]:
        """Ids of committed rows that did not fail."""
        return succeeded_in(self.shard_files())

    def committed_ids(self) -> set[str]:
        """Every id with a terminal state: in a visible shard or in committed errors."""
        ids = {r for f in self.shard_files() for r in self._read_checked(f, "id")}
        ids.update(str(e["id"]) for e in self.iter_errors() if e.get("id") is not None)
        return ids

    def committed_idset(self) -> IdSet:
        """committed_ids() in 8 bytes an id, read from the shards' id columns (io.ids)."""
        chunks = [hash_ids(read_id_array(f)) for f in self.shard_files()]
        errors = [str(e["id"]) for e in self.iter_errors() if e.get("id") is not None]
        return IdSet.from_chunks([*chunks, hash_ids(errors) if errors else []])

    def committed_rows(self) -> row_ranges.CommittedRows:
        """The input rows the shards present hold, by row range (io/row_ranges.py)."""
        return row_ranges.CommittedRows.read(self.path, [f.name for f in self.shard_files()])

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
        return f"part-{(max(nums) + 1 if nums else 0):05d}{self.shards.suffix}"

    def commit(
        self,
        m: Manifest,
        records: list[dict[str, Any]],
        errors: list[RowError],
        sources: list[Any] | None = None,
    ) -> None:
        """Commit finished rows and errors in the order of the module doc.

        The shard is written under its temporary name first (invisible until renamed): a row
        whose values cannot be written fails alone, as an error line, and the rest of the batch
        is committed. `sources` (a RowRef per record) place those error lines."""
        self._commits += 1
        path = self.results / self.next_shard_name() if records else None
        tmp = None
        if path is not None:
            tmp, records, failed = self._write_shard(records, path, sources)
            errors = [*errors, *failed]
        errors = self._error_places.new(errors)
        if errors:
            with naming(self.errors_path), open(self.errors_path, "a", encoding="utf-8") as f:
                for e in errors:
                    f.write(error_line(self.error_record(e)))
                f.flush()
                os.fsync(f.fileno())
        fault("after_errors", self._commits)
        m.errors_bytes = self.errors_path.stat().st_size if self.errors_path.exists() else 0
        if tmp is not None:
            row_ranges.forget(self.path, path.name)  # a stale file never names this shard's rows
            publish(tmp, path)
            m.shards.append({"name": path.name, "rows": len(records), "bytes": path.stat().st_size})
            if sources is not None and len(sources) == len(records):  # none split out
                row_ranges.record(self.path, path.name, sources)
        fault("after_shard", self._commits)
        ok = sum(r["finish_reason"] != "error" for r in records)
        for key, n in (("succeeded", ok), ("failed", len(errors))):
            m.counts[key] = m.counts.get(key, 0) + n
        self.save_manifest(m)
        fault("after_manifest", self._commits)

    def _write_shard(
        self, records: list[dict[str, Any]], path: Path, sources: list[Any] | None
    ) -> tuple[Path | None, list[dict[str, Any]], list[RowError]]:
        """(temporary shard or None, records in it, errors for the records left out)."""
        try:
            return write_temp(records, path, self.write), records, []
        except OSError:
            raise  # the disk's fault, not a row's: the CLI names it (75 or 78)
        except Exception:
            kept, failed = split_unwritable(records, self.fmt, sources, self.write)
        return (write_temp(kept, path, self.write) if kept else None), kept, failed

    def forget_failed(self, m: Manifest) -> int:
        """--retry-errors: failed rows become pending again. Returns how many there were.

        Shards lose their `finish_reason: error` rows first (each rewritten atomically), then
        errors.jsonl goes: a crash in between leaves those rows failed, never in two states.
        """
        self.success_path.unlink(missing_ok=True)
        m.finished_at, m.outcome = None, {}
        self.save_manifest(m)  # no longer finished, before anything else changes
        failed = sum(1 for _ in self.iter_errors())
        # The failed attempts stay paid: their cost is recorded before their rows go, and
        # settled (by what is actually gone) here or, after a crash, by the next prepare.
        m.retiring_cost_usd = self._failed_cost()
        self.save_manifest(m)
        row_ranges.forget_all(self.path)  # before any shard is rewritten
        for f in self.shard_files():
            _drop_failed_rows(f)
        self.errors_path.unlink(missing_ok=True)
        fsync_dir(self.path)
        self._error_places = ErrorPlaces()
        self._settle_retired(m)
        self.recount(m)
        self.save_manifest(m)
        return failed

    def _failed_cost(self) -> float:
        return sum(_failed_rows_cost(f) for f in self.shard_files())

    def _settle_retired(self, m: Manifest) -> None:
        if m.retiring_cost_usd:
            m.retired_cost_usd += max(0.0, m.retiring_cost_usd - self._failed_cost())
            m.retiring_cost_usd = 0.0

    def mark_finished(self, m: Manifest, exit_code: int, message: str = "") -> None:
        """Every row has its final state: record the outcome (reports are written next)."""
        m.finished_at = time.time()
        m.outcome = {"exit_code": exit_code, "message": message}
        self.save_manifest(m)

    def mark_success(self, m: Manifest | None = None) -> None:
        """_SUCCESS, written last and only for exit 0: its presence means the results and
        reports are complete and within input.max_error_rate (orchestrators' file sensors)."""
        if m is not None and m.finished_at is None:
            self.mark_finished(m, 0)
        write_text_atomic(self.success_path, "")
        fsync_file(self.success_path)


SCHEMA_HINT = (
    " (each column's type is fixed for the whole run at its first start, manifest.json"
    " `schema`: a value of another type fails its row; --restart types the columns anew)"
)


def split_unwritable(
    records: list[dict[str, Any]], fmt: str, sources: list[Any] | None, write: Callable
) -> tuple[list[dict[str, Any]], list[RowError]]:
    """(the records `write`, the shard writer, can write, an error for each it cannot: a value
    its format or the run's schema cannot hold); re-raises when every record writes alone (the
    batch's failure is then not a row's)."""
    bad = unwritable(records, write)
    if not bad:
        raise
    failed = [
        RowError(
            "unwritable",
            f"the row's values cannot be written as {fmt}: {type(e).__name__}: {e}"
            f"{SCHEMA_HINT if fmt == 'parquet' else ''}",
            sources[i] if sources else None,
            str(records[i].get("id")),
        )
        for i, e in bad.items()
    ]
    return [r for i, r in enumerate(records) if i not in bad], failed


def error_line(record: dict[str, Any]) -> str:
    """One errors.jsonl line, always writable: text that UTF-8 cannot hold (a lone surrogate
    from the input) is written escaped."""
    line = json.dumps(record, ensure_ascii=False, default=str)
    try:
        line.encode("utf-8")
    except UnicodeEncodeError:
        line = json.dumps(record, default=str)
    return line + "\n"


class ErrorPlaces:
    """The (file, row) of committed errors without an id. Such rows are re-read on every
    resume, so each place's error is committed once (both run-directory kinds)."""

    def __init__(self, committed: Iterable[dict[str, Any]] = ()) -> None:
        self._seen = {_place(e) for e in committed if e.get("id") is None}

    def new(self, errors: list[RowError]) -> list[RowError]:
        """`errors` less those of a place already committed; records the new places."""
        out = []
        for e in errors:
            if e.id is None:
                place = _place(e.to_json())
                if place in self._seen:
                    continue
                self._seen.add(place)
            out.append(e)
        return out


def _place(e: dict[str, Any]) -> tuple:
    return (e.get("file"), e.get("row"))


def fault(point: str, commit: int) -> None:
    """Tests only: SIGKILL this process at `point` of commit number `commit` (FAULT_ENV)."""
    spec = os.environ.get(FAULT_ENV)
    if spec and spec == f"{point}:{commit}":
        os.kill(os.getpid(), signal.SIGKILL)


def read_shard(path: Path | str) -> list[dict[str, Any]]:
    return read_columns(path, None)


def read_columns(path: Path | str, names: list[str] | None) -> list[dict[str, Any]]:
    """A shard's records (local path or store URL), only `names` if given."""
    with open_file(str(path)) as f:
        if str(path).endswith(".parquet"):
            import pyarrow.parquet as pq

            return pq.read_table(f, columns=names).to_pylist()
        recs = [json.loads(line) for line in f if line.strip()]
    return recs if names is None else [{k: r.get(k) for k in names} for r in recs]


def read_committed(path: Path | str, names: list[str] | None) -> list[dict[str, Any]]:
    """read_columns of a committed shard: one that does not read is named (78) with what to
    do, as a run names it."""
    try:
        return read_columns(path, names)
    except Exception as e:  # pyarrow and json raise several types for a damaged file
        raise damaged_shard(path, e) from e


def damaged_shard(shard: Path | str, e: Exception) -> RunDirError:
    return RunDirError(
        f"{shard} does not read ({type(e).__name__}: {e}): it was damaged after it was"
        " committed. Move it out of results/ and run again (its rows are generated"
        " again), or --restart"
    )


def read_column(path: Path | str, name: str) -> list[Any]:
    if str(path).endswith(".parquet"):
        values = _parquet_column(path, name).to_pylist()
    else:
        values = [rec[name] for rec in read_shard(path)]
    return [str(v) for v in values] if name == "id" else values


def _parquet_column(path: Path | str, name: str):
    import pyarrow.parquet as pq

    with open_file(str(path)) as f:
        return pq.read_table(f, columns=[name]).column(name)


def read_id_array(path: Path | str):
    """A shard's ids as Arrow strings (Parquet: the id column alone)."""
    import pyarrow as pa

    if str(path).endswith(".parquet"):
        return _parquet_column(path, "id")
    return pa.array(read_column(path, "id"), pa.string())


def count_rows(path: Path | str) -> tuple[int, int]:
    """(rows, rows with finish_reason error) of a shard, vectorized for Parquet."""
    if not str(path).endswith(".parquet"):
        reasons = read_column(path, "finish_reason")
        return len(reasons), sum(r == "error" for r in reasons)
    import pyarrow.compute as pc

    col = _parquet_column(path, "finish_reason")
    return len(col), int(pc.sum(pc.equal(col, "error")).as_py() or 0)


def succeeded_in(shards: Iterable[Path | str]) -> set[str]:
    """Ids of the rows in `shards` (local paths or store URLs) that did not fail."""
    out: set[str] = set()
    for f in shards:
        ids, reasons = read_column(f, "id"), read_column(f, "finish_reason")
        out.update(i for i, r in zip(ids, reasons, strict=True) if r != "error")
    return out


def read_ids(path: Path) -> list[str]:
    return read_column(path, "id")


def _failed_rows_cost(path: Path) -> float:
    reasons = read_column(path, "finish_reason")
    if "error" not in reasons:
        return 0.0
    costs = read_column(path, "cost_usd")
    return sum(c or 0.0 for c, r in zip(costs, reasons, strict=True) if r == "error")


def check_ours(rundir: RunDir) -> None:
    """A directory is a run's when it holds a manifest, or nothing a run would not write before
    its first one; anything else is the user's and is refused, never truncated or deleted.
    A directory inside another run's is refused too (check_not_inside_a_run)."""
    check_not_inside_a_run(rundir.path)
    if rundir.manifest_path.exists() or not rundir.path.is_dir():
        return  # a run's, or nothing yet (make_run_dir names a file in its place)
    foreign = [
        p.name
        for p in sorted(rundir.path.iterdir())
        if not (
            (p.name in BEFORE_MANIFEST and not (p.is_dir() and any(p.iterdir())))
            or TEMP_NAME.fullmatch(p.name)
        )
    ]
    if foreign:
        raise not_a_run(str(rundir.path), "no manifest.json", foreign, "into an empty directory")


def check_not_inside_a_run(path: Path) -> None:
    """A run directory inside another one would break it (a folder in its results/, another
    job's files among its own; --restart of either would delete the other's): refused (78).
    The other way round needs no check: a folder holding a run below it is not empty and not a
    run's (check_ours refuses it), and a run's own folders hold only its files (clear)."""
    for above in Path(path).resolve().parents:
        if is_run_dir(above):
            raise RunDirError(
                f"output.path {path} is inside the run directory {above}: a run directory holds"
                " one run's files only. Choose an output.path outside it"
            )


def not_a_run(where: str, lacks: str, foreign: list[str], empty: str) -> RunDirError:
    """The refusal of an output.path that holds `foreign` files and no run (either kind)."""
    shown = ", ".join(foreign[:5]) + (f", ... {len(foreign) - 5} more" if len(foreign) > 5 else "")
    return RunDirError(
        f"output.path {where} is not empty and holds no jobrunner run ({lacks}; found {shown}):"
        f" a run writes only {empty} or its own run directory. Choose a new output.path, or"
        " empty this one"
    )


def make_run_dir(path: Path) -> None:
    """Create output.path, or say why it cannot be the run directory (78 with the fix)."""
    if not str(path).strip():
        raise RunDirError("output.path is empty: name the run directory (e.g. out/my-job)")
    if path.exists() and not path.is_dir():
        raise RunDirError(
            f"output.path {path} is a file, not a directory: choose another output.path"
        )
    try:
        path.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as e:
        above = next((p for p in path.parents if p.exists() and not p.is_dir()), e.filename)
        raise RunDirError(
            f"output.path {path}: {above} is a file, so the directory cannot be made;"
            " choose another output.path"
        ) from e
    except OSError as e:
        from jobrunner.errors import from_os_error

        raise (from_os_error(e) or e) from e


def _drop_failed_rows(path: Path) -> None:
    if "error" not in read_column(path, "finish_reason"):
        return
    kept = without_failed(path.read_bytes(), path.suffix).data
    if kept is not None:
        write_atomic([], path, lambda _, tmp: tmp.write_bytes(kept))
    else:
        path.unlink()
        fsync_dir(path.parent)
