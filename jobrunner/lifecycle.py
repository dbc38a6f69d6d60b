"""The run lifecycle every executor follows, so the local and the Ray run end alike.

`execute(cfg, opts, work)` is an executor's whole job:

    rundir = run_dir(cfg)
    if (done := answer_finished(rundir, cfg, opts)) is not None:
        return done                                   # a finished job answers with its outcome
    with stop_before_rows() as stop, start_run(rundir, cfg, opts) as (manifest, ..., check):
        committed, interrupted = work(OpenRun(...))   # the executor's own: generate and commit
        run.ready()                                   # the input checked (resume.start_run)
        return finish_run(cfg, rundir, manifest, interrupted, committed)

`finish_run` saves the manifest, writes the reports, assembles the output format's files,
marks _SUCCESS and applies the error budget (exit 65), in that order.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from jobrunner.config import JobConfig
from jobrunner.errors import InputDataError, Interrupted, RunDirError
from jobrunner.formats import output_format
from jobrunner.input_check import InputCheck
from jobrunner.io.committer import Write, into_rundir
from jobrunner.io.ids import IdSet
from jobrunner.io.run_lock import report_lock, run_lock_where_writable
from jobrunner.io.rundir import Manifest, RunDir, make_run_dir
from jobrunner.io.store_rundir import open_rundir
from jobrunner.resume import check_same_job, open_run, start_run
from jobrunner.signals import SignalLatch, raise_on_signal
from jobrunner.telemetry.model import Report, load_report
from jobrunner.telemetry.report import REPORT_FILES, write_reports

log = logging.getLogger(__name__)

__all__ = [
    "JobSummary",
    "OpenRun",
    "RunOptions",
    "answer_finished",
    "execute",
    "finish_run",
    "open_run",
    "output_state",
    "rebuild_reports",
    "run_dir",
    "stop_before_rows",
]


@dataclass
class RunOptions:
    restart: bool = False
    retry_errors: bool = False


@dataclass
class JobSummary:
    status: str  # "done" | "nothing_to_do" | "interrupted"
    output: str
    rows: dict[str, int] = field(default_factory=dict)
    cost_usd: float = 0.0
    report: Report = field(default_factory=Report)

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "output": self.output,
            "rows": self.rows,
            "cost_usd": round(self.cost_usd, 8),
        }


@dataclass
class OpenRun:
    """A run an executor works on: locked, fingerprinted, its committed ids known."""

    cfg: JobConfig
    opts: RunOptions
    rundir: RunDir
    manifest: Manifest
    skip_ids: IdSet  # ids already terminal
    total_rows: int  # input rows, skipped ones included
    stop: SignalLatch  # re-raise a signal a library swallowed
    check: InputCheck = field(default_factory=InputCheck)  # the whole-input pass, maybe running

    def ready(self) -> None:
        """Wait for the input check (duplicate ids, strays, row digests); raise what it found.
        Every commit of the run comes after it (`commit_write`)."""
        self.check.wait()

    def commit_write(self) -> Write:
        """The run directory's commit, each call after `ready()`."""
        write = into_rundir(self.rundir, self.manifest)

        def gated(records, errors, sources):
            self.ready()
            return write(records, errors, sources)

        return gated


# The executor's part: generate and commit every pending row, append one RunRecord to
# run.manifest.runs; returns (rows committed, interrupted).
Work = Callable[[OpenRun], tuple[int, bool]]


def execute(cfg: JobConfig, opts: RunOptions, work: Work) -> JobSummary:
    """A whole job, `work` doing the generating: the one lifecycle of every executor."""
    rundir = run_dir(cfg)
    if (done := answer_finished(rundir, cfg, opts)) is not None:
        return done
    with (
        stop_before_rows() as stop,
        start_run(rundir, cfg, opts) as (manifest, skip_ids, total, check),
    ):
        run = OpenRun(cfg, opts, rundir, manifest, skip_ids, total, stop, check)
        committed, interrupted = work(run)
        if not interrupted:
            run.ready()  # a run that committed nothing still refuses an input that fails it
        return finish_run(cfg, rundir, manifest, interrupted, committed)


def run_dir(cfg: JobConfig) -> RunDir:
    """The job's run directory (local, or on an object store), its shards and error lines in
    the output format's shape."""
    out = output_format(cfg.output.format)
    return open_rundir(cfg.output.path, out.shard_format, out.error_record)


def output_state(cfg: JobConfig) -> str:
    """What `run` would find at output.path, by the checks `run` makes, writing nothing: "new",
    "resumes" (this job, unfinished) or "finished" (this job); raises what `run` would raise
    (78: a directory not a run's or inside another run's, a different job)."""
    rundir = run_dir(cfg)
    rundir.check_ours()
    if rundir.load_manifest() is None:
        return "new"
    check_same_job(rundir, cfg)
    return "finished" if rundir.finished else "resumes"


def answer_finished(rundir: RunDir, cfg: JobConfig, opts: RunOptions) -> JobSummary | None:
    """A finished run that is not to be redone answers with its outcome (0 or 65), completing
    whatever a crash left undone; None when the run has work to do. A changed job is refused
    (78), even when this one is done."""
    rundir.check_ours()  # a _SUCCESS with no manifest beside it is not this job's
    if not _done(rundir, opts):
        return None
    check_same_job(rundir, cfg)
    make_run_dir(rundir.path)  # a store run's local staging directory, where the lock is
    with run_lock_where_writable(rundir.path):  # no other run may write what it completes
        if not _done(rundir, opts):  # a run that held the lock changed it
            return None
        if not rundir.check_finished(rundir.load_manifest()):
            log.warning("%s: committed shards are gone; their rows run again", rundir.location)
            rundir.unmark_success()
            return None
        return _close(cfg, rundir, None)


def _done(rundir: RunDir, opts: RunOptions) -> bool:
    """Finished, and not to be redone (--restart, --retry-errors with errors to retry)."""
    if not rundir.finished or opts.restart:
        return False
    return not (opts.retry_errors and rundir.has_errors)


def rebuild_reports(rundir: RunDir) -> Report:
    """`jobrunner report`: every report rebuilt from what the run directory has committed,
    between runs only: while a run holds it, RunInProgress (75), and nothing is written."""
    manifest = rundir.load_manifest()
    if manifest is None:
        raise RunDirError(
            f"{rundir.location} is not a jobrunner run directory (no {rundir.location}/manifest.json):"
            " give the output.path of a job that has run"
        )
    rows = sum(manifest.counts.get(k, 0) for k in ("succeeded", "failed"))
    so_far = f"{rows:,} row{'' if rows == 1 else 's'} committed so far"
    with report_lock(rundir.path, rundir.location, so_far):
        return write_reports(rundir)


def stop_before_rows():
    """SIGTERM/SIGINT outside the generating loop (scan, model load, last commit): exit 75 at
    once; commits are atomic. An executor installs its graceful handler while rows run."""
    return raise_on_signal(
        lambda signum: Interrupted(
            f"signal {signum}: stopped; committed rows are kept, run the same command again to continue"
        )
    )


def finish_run(
    cfg: JobConfig, rundir: RunDir, manifest: Manifest, interrupted: bool, committed: int
) -> JobSummary:
    """Close an invocation whose run record is in `manifest.runs`: reports always; the outcome,
    output files and _SUCCESS only when the input was done (Interrupted, exit 75, if not)."""
    rundir.save_manifest(manifest)
    if interrupted:
        write_reports(rundir)
        raise Interrupted(
            f"interrupted: {committed} rows committed to {rundir.location};"
            " run the same command again to continue"
        )
    return _close(cfg, rundir, manifest)


def _close(cfg: JobConfig, rundir: RunDir, manifest: Manifest | None) -> JobSummary:
    """Every row has its final state: record the outcome, write the reports, then `_SUCCESS`.

    Each step can be redone, so a rerun of a finished run (`manifest` None: nothing ran)
    completes whatever a crash left undone (missing reports, a missing `_SUCCESS`) and answers
    with the job's outcome. `_SUCCESS` is written last and only for exit 0; a job over
    input.max_error_rate exits 65 and has none (DESIGN.md, "The run directory").
    """
    ran = manifest is not None
    m = manifest or rundir.load_manifest() or Manifest()
    failure = _error_rate_error(cfg, m.counts, rundir.location)
    code = failure.exit_code if failure else 0
    if m.finished_at is None or m.outcome.get("exit_code") != code:
        rundir.mark_finished(m, code, str(failure) if failure else "")
    out = output_format(cfg.output.format)
    if out.finalize and (ran or _missing(rundir, out.finalized)):
        out.finalize(rundir, m, cfg)  # after the finish time it records is known
    report = write_reports(rundir) if ran else _load_or_rebuild_report(rundir)
    if failure is None and not rundir.success_marked:
        rundir.mark_success()
    elif failure is not None and rundir.success_marked:
        rundir.unmark_success()
    if failure:
        raise failure
    r = report.rows
    skipped = r.skipped if ran else r.total  # nothing redone: every committed row was skipped
    rows = {"succeeded": r.succeeded, "failed": r.failed, "skipped": skipped}
    status = "done" if ran else "nothing_to_do"
    return JobSummary(status, rundir.location, rows, report.cost.cost_usd, report)


def _load_or_rebuild_report(rundir: RunDir) -> Report:
    try:
        report = load_report(rundir.path)
    except (OSError, ValueError):
        log.info("%s: report.json missing or unreadable; rebuilding the reports", rundir.location)
        return write_reports(rundir)
    if _missing(rundir, REPORT_FILES):
        log.info("%s: a report file is missing; rebuilding the reports", rundir.location)
        return write_reports(rundir)
    return report


def _missing(rundir: RunDir, names: tuple[str, ...]) -> bool:
    """Whether any of the run directory's files `names` is gone (a rerun remakes them)."""
    missing = [n for n in names if not (rundir.path / n).exists()]
    if missing:
        log.info("%s: %s missing; made again", rundir.location, ", ".join(missing))
    return bool(missing)


def _error_rate_error(cfg: JobConfig, counts: dict[str, int], where) -> InputDataError | None:
    ok, failed = counts.get("succeeded", 0), counts.get("failed", 0)
    total = ok + failed
    rate = failed / total if total else 0.0
    if rate <= cfg.input.max_error_rate:
        return None
    return InputDataError(
        f"{failed} of {total} rows failed ({rate:.1%}, over input.max_error_rate"
        f" {cfg.input.max_error_rate:.1%}); see {where}/errors.jsonl"
    )
