"""run_job(cfg): read -> prepare -> generate -> write -> report.

The orchestrator: everything it calls lives in a stage module. It guarantees the run-directory
promises of DESIGN.md: a finished job is not touched again, a resumed job skips committed rows,
and whatever happens, finished rows are committed before we return or raise.
"""

from __future__ import annotations

import logging
import signal
import time
from dataclasses import dataclass, field
from typing import Any

from jobrunner.config import JobConfig
from jobrunner.errors import InputDataError, Interrupted
from jobrunner.formats import output_format
from jobrunner.io.committer import Committer
from jobrunner.io.ids import IdSet
from jobrunner.io.rundir import Manifest, RunDir
from jobrunner.io.store_rundir import open_rundir
from jobrunner.signals import SignalLatch, raise_on_signal
from jobrunner.telemetry.device import detect_device
from jobrunner.telemetry.model import load_report
from jobrunner.telemetry.prices import device_rate, run_price_fields
from jobrunner.telemetry.progress import Progress
from jobrunner.telemetry.report import write_reports

log = logging.getLogger(__name__)


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
    report: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "output": self.output,
            "rows": self.rows,
            "cost_usd": round(self.cost_usd, 8),
        }


def run_job(cfg: JobConfig, opts: RunOptions | None = None) -> JobSummary:
    from jobrunner.resume import check_same_job, open_run

    opts = opts or RunOptions()
    out = output_format(cfg.output.format)
    rundir = open_rundir(cfg.output.path, out.shard_format, out.error_record)
    if rundir.finished and not opts.restart and not (opts.retry_errors and rundir.has_errors):
        check_same_job(rundir, cfg)  # a changed job is refused (78), even when this one is done
        return finish_run(cfg, rundir, None)  # the job's outcome again (0 or 65)
    with (
        _stop_before_rows() as stop,
        open_run(rundir, cfg, opts) as (manifest, skip_ids, total_rows),
    ):
        return _generate(cfg, rundir, manifest, skip_ids, total_rows, stop)


def _stop_before_rows():
    """SIGTERM/SIGINT outside the engine loop (scan, model load, last commit): exit 75 at once;
    commits are atomic. _run_engine installs its graceful handler while rows are generated."""
    return raise_on_signal(
        lambda signum: Interrupted(
            f"signal {signum}: stopped; committed rows are kept, run the same command again to continue"
        )
    )


def _generate(
    cfg: JobConfig,
    rundir: RunDir,
    manifest: Manifest,
    skip_ids: IdSet,
    total_rows: int,
    stop: SignalLatch,
) -> JobSummary:
    from jobrunner.telemetry.run import RunTelemetry

    t0 = time.monotonic()
    telemetry = RunTelemetry(rundir.path).start()
    try:
        return _generate_sampled(cfg, rundir, manifest, skip_ids, total_rows, t0, telemetry, stop)
    finally:
        telemetry.sampler.stop()  # a failed or interrupted run leaves no sampling thread behind


def _generate_sampled(
    cfg: JobConfig,
    rundir: RunDir,
    manifest: Manifest,
    skip_ids: IdSet,
    total_rows: int,
    t0: float,
    telemetry,
    stop: SignalLatch,
) -> JobSummary:
    from jobrunner.engine.engines import make_engine
    from jobrunner.engine.loader import load_model
    from jobrunner.engine.quant.apply import check_engine, prepare_weights
    from jobrunner.prep.stream import PrepStream

    device = detect_device()
    rate = device_rate(device, cfg.cost)
    usd_per_hour, price_source = rate.usd_per_hour, rate.label
    loaded = load_model(cfg.model)
    weights = prepare_weights(loaded, cfg)  # quality gate (exit 65 below the bar), quantization
    engine = make_engine(loaded, cfg)
    check_engine(engine, cfg)
    stop.reraise()  # a signal during start-up whose exception a library swallowed
    load_seconds = time.monotonic() - t0
    stream = PrepStream(
        cfg,
        loaded.tokenizer,
        skip_ids,
        order=_order(cfg),
        compile_grammar=getattr(engine, "compile_grammar", None),
    ).start()
    committer = Committer(
        rundir,
        manifest,
        loaded.source.name,
        usd_per_hour,
        cfg.output.shard_rows,
        cfg.output.shard_seconds,
        stream.drain_errors,
        measured_seconds=lambda: engine.stats.row_seconds,
        expected_rows=total_rows - len(skip_ids),
    )
    committer.start_clock(since=t0)  # model load is paid for too, by every row
    progress = Progress(
        total_rows - len(skip_ids),
        live=engine.stats,
        prompt=stream,
        max_new_tokens=cfg.generation.max_new_tokens,
    )
    try:
        interrupted = _run_engine(engine, stream, committer, progress)
    finally:
        progress.close()
    committer.commit(final=True)
    _record_run(
        manifest,
        cfg,
        engine,
        stream,
        device,
        usd_per_hour,
        price_source,
        time.monotonic() - t0,
        load_seconds,
    )
    manifest.runs[-1].update(run_price_fields(rate, cfg.cost))
    if not interrupted:
        _record_profile(cfg, device, engine, committer, manifest.runs[-1])
    manifest.runs[-1].update(
        weights,
        kv_bytes_per_token=engine.stats.kv_bytes_per_token,
        num_kv_blocks=engine.stats.num_kv_blocks,
    )
    manifest.runs[-1].update(
        telemetry.finish(
            len(manifest.runs) - 1,
            engine.stats.step_log,
            committer.savings.to_json(),
            committer.row_log,
        )
    )
    rundir.save_manifest(manifest)
    if interrupted:
        write_reports(rundir)
        raise Interrupted(
            f"interrupted: {committer.rows_committed} rows committed to"
            f" {rundir.location}; run the same command again to continue"
        )
    return finish_run(cfg, rundir, manifest)


def _run_engine(engine, stream, committer: Committer, progress: Progress) -> bool:
    """Drive the engine to the end of the input, or to a SIGTERM/SIGINT. True if interrupted."""
    state = {"signals": 0}

    def on_signal(signum, frame):
        state["signals"] += 1
        if state["signals"] > 1:
            raise KeyboardInterrupt  # second signal: leave at once (commits are atomic)
        log.warning("signal %s: finishing committed work and exiting", signum)
        engine.request_stop()
        stream.stop()

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        for result in engine.generate(stream.requests()):
            done = [result, *stream.fan_out(result)]
            committer.add(done)
            progress.advance(done)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        stream.stop()
    return state["signals"] > 0


def _order(cfg: JobConfig):
    try:
        from jobrunner.prep.order import order_requests
    except ImportError:
        return None
    return lambda reqs: order_requests(reqs, cfg.engine.order_window)


def _record_run(
    manifest: Manifest,
    cfg: JobConfig,
    engine,
    stream,
    device,
    usd_per_hour: float,
    price_source: str,
    wall: float,
    load_seconds: float,
) -> None:
    st = engine.stats
    manifest.runs.append(
        {
            "job": cfg.name,
            "model": cfg.model.source,
            "engine": engine.kind,
            "wall_seconds": wall,
            "load_seconds": load_seconds,
            "engine_seconds": st.engine_seconds,
            "forward_seconds": st.forward_seconds,
            "steps": st.steps,
            "preemptions": st.preemptions,
            "oom_retries": st.oom_retries,
            "draft_tokens": st.draft_tokens,
            "accepted_draft_tokens": st.accepted_draft_tokens,
            "deduplicated": stream.deduplicated,
            "skipped": stream.skipped,
            "device_name": device.name,
            "device_kind": device.kind,
            "device_count": device.count,
            "usd_per_hour": usd_per_hour,
            "price_source": price_source,
            "notes": list(st.notes),
            "finished_at": time.time(),
        }
    )


def _record_profile(cfg: JobConfig, device, engine, committer: Committer, run: dict) -> None:
    """This run's measured steps go to the device profile the next estimate fits (telemetry)."""
    from jobrunner.telemetry.profile import profile_key, record

    ledger = committer.ledger
    can_stop = not cfg.generation.ignore_eos and cfg.input.format != "openai-batch"
    bound = ledger.computations * cfg.generation.max_new_tokens
    try:
        record(
            profile_key(cfg, device),
            steps=engine.stats.step_log,
            load_seconds=run["load_seconds"],
            engine_seconds=run["engine_seconds"],
            wall_seconds=run["wall_seconds"],
            rows=committer.rows_committed,
            completion_fraction=ledger.completion_tokens / bound if can_stop and bound else None,
        )
    except OSError as e:  # a read-only cache never fails a job that finished its rows
        log.warning("could not save the device profile: %s", e)


def finish_run(cfg: JobConfig, rundir: RunDir, manifest: Manifest | None) -> JobSummary:
    """Every row has its final state: record the outcome, write the reports, then `_SUCCESS`.

    Each step can be redone, so a rerun of a finished run (`manifest` None: nothing ran)
    completes whatever a crash left undone (missing reports, a missing `_SUCCESS`) and answers
    with the job's outcome. `_SUCCESS` is written last and only for exit 0; a job over
    input.max_error_rate exits 65 and has none (DESIGN.md, "The run directory").
    """
    ran = manifest is not None
    if ran:
        finalize_output(cfg, rundir, manifest)
    m = manifest or rundir.load_manifest() or Manifest()
    failure = _error_rate_error(cfg, m.counts, rundir.path)
    code = failure.exit_code if failure else 0
    if m.finished_at is None or m.outcome.get("exit_code") != code:
        rundir.mark_finished(m, code, str(failure) if failure else "")
    report = write_reports(rundir) if ran else _load_or_rebuild_report(rundir)
    if failure is None and not rundir.success_path.is_file():
        rundir.mark_success()
    elif failure is not None and rundir.success_path.is_file():
        rundir.success_path.unlink()  # a lowered max_error_rate: the job no longer passes
    if failure:
        raise failure
    rows = {k: report["rows"][k] for k in ("succeeded", "failed", "skipped")}
    status = "done" if ran else "nothing_to_do"
    if not ran:  # this invocation redid none: every committed row was skipped
        rows["skipped"] = report["rows"]["total"]
    return JobSummary(status, rundir.location, rows, report["cost"]["cost_usd"], report)


def _load_or_rebuild_report(rundir: RunDir) -> dict[str, Any]:
    try:
        return load_report(rundir.path)
    except (OSError, ValueError):
        log.info("%s: report.json missing or unreadable; rebuilding the reports", rundir.path)
        return write_reports(rundir)


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


def finalize_output(cfg: JobConfig, rundir: RunDir, manifest: Manifest) -> None:
    """Files the output format assembles from the committed shards (e.g. openai-batch)."""
    finalize = output_format(cfg.output.format).finalize
    if finalize:
        finalize(rundir, manifest, cfg)
