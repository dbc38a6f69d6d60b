"""run_job(cfg): read -> prepare -> generate -> write -> report, in this process (the local executor).

The orchestrator: everything it calls lives in a stage module, and the start and the end of the
run are the lifecycle every executor shares (lifecycle.py). It guarantees the run-directory
promises of DESIGN.md: a finished job is not touched again, a resumed job skips committed rows,
and whatever happens, finished rows are committed before we return or raise.
"""

from __future__ import annotations

import logging
import signal
import time

from jobrunner.collector import settled
from jobrunner.config import JobConfig
from jobrunner.io.committer import Committer
from jobrunner.lifecycle import JobSummary, OpenRun, RunOptions, execute
from jobrunner.prep.stream import PrepStream
from jobrunner.telemetry import profile
from jobrunner.telemetry.device import detect_device
from jobrunner.telemetry.prices import device_rate
from jobrunner.telemetry.progress import Progress
from jobrunner.telemetry.record import RunRecord
from jobrunner.telemetry.run import RunTelemetry

__all__ = ["JobSummary", "RunOptions", "run_job"]

log = logging.getLogger(__name__)


def run_job(cfg: JobConfig, opts: RunOptions | None = None) -> JobSummary:
    return execute(cfg, opts or RunOptions(), _generate)


def _generate(run: OpenRun) -> tuple[int, bool]:
    """Generate every pending row; (rows committed, interrupted). Appends this run's record."""
    t0 = time.monotonic()
    before_load = _since_process_start()  # interpreter, imports, the job, the input's scan
    telemetry = RunTelemetry(run.rundir.path).start()
    try:
        return _generate_sampled(run, t0, before_load, telemetry)
    finally:
        telemetry.sampler.stop()  # a failed or interrupted run leaves no sampling thread behind


def _generate_sampled(
    run: OpenRun, t0: float, before_load: float | None, telemetry: RunTelemetry
) -> tuple[int, bool]:
    from jobrunner.engine.start import start_engine

    cfg, manifest = run.cfg, run.manifest

    device = detect_device()
    rate = device_rate(device, cfg.cost)
    started = start_engine(cfg, since=t0)  # the quality gate may end the job here (exit 65)
    engine = started.engine
    run.stop.reraise()  # a signal during start-up whose exception a library swallowed
    grammar = getattr(engine, "compile_grammar", None)
    stream = PrepStream(
        cfg,
        started.loaded.tokenizer,
        run.skip_ids,
        compile_grammar=grammar,
        committed_rows=run.rundir.committed_rows,
    )
    committer = _committer(run, started, rate, stream)
    committer.start_clock(since=t0)  # model load is paid for too, by every row
    progress = Progress(
        run.total_rows - len(run.skip_ids),
        live=engine.stats,
        prompt=stream,
        max_new_tokens=0 if cfg.task == "embed" else cfg.generation.max_new_tokens,
    )
    with settled():  # fewer garbage collections while rows stream (collector.py)
        stream.start()
        try:
            interrupted = _run_engine(engine, stream, committer, progress)
        finally:
            progress.close()
        committer.commit(final=True)
    record = RunRecord.of_engine(
        cfg,
        started,
        device,
        rate,
        wall_seconds=time.monotonic() - t0,
        before_load_seconds=before_load,
        deduplicated=stream.deduplicated,
        skipped=stream.skipped,
    )
    if not interrupted:
        _record_profile(cfg, device, engine, committer, record)
    run_index = len(manifest.runs)
    saved = telemetry.finish(
        run_index, engine.stats.step_log, committer.savings.to_json(), committer.row_log
    )
    manifest.runs.append({**record.to_json(), **saved})
    return committer.rows_committed, interrupted


def _since_process_start() -> float | None:
    """Seconds from this process's start (the kernel's record of it) to now."""
    import psutil

    try:
        return max(0.0, time.time() - psutil.Process().create_time())
    except psutil.Error:
        return None


def _committer(run: OpenRun, started, rate, stream: PrepStream) -> Committer:
    """Shards every output.shard_rows rows or shard_seconds, priced by the work of each row."""
    engine = started.engine
    return Committer(
        run.commit_write(),  # the first commit waits for the input check
        started.loaded.source.name,
        rate.usd_per_hour,
        run.cfg.output.shard_rows,
        run.cfg.output.shard_seconds,
        stream.drain_errors,
        measured_seconds=lambda: engine.stats.row_seconds,
        expected_rows=run.total_rows - len(run.skip_ids),
    )


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
        for result in engine.generate(stream.stream()):
            if state.setdefault("results", 0) == 0:  # a marker the scale bench waits for
                log.info("first result, %.1f s after the model load began", _since(committer))
            state["results"] += 1
            done = [result, *stream.fan_out(result)]
            committer.add(done)
            progress.advance(done)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        stream.stop()
    return state["signals"] > 0


def _since(committer: Committer) -> float:
    return time.monotonic() - committer.ledger.start


def _record_profile(cfg: JobConfig, device, engine, committer: Committer, run: RunRecord) -> None:
    """This run's measured steps go to the device profile the next estimate fits (telemetry)."""
    ledger = committer.ledger
    can_stop = not cfg.generation.ignore_eos and cfg.input.format != "openai-batch"
    bound = ledger.computations * cfg.generation.max_new_tokens * cfg.generation.n
    try:
        profile.record(
            profile.profile_key(cfg, device, str(engine.loaded.dtype).removeprefix("torch.")),
            steps=engine.stats.step_log,
            load_seconds=run.load_seconds,
            engine_seconds=run.engine_seconds,
            wall_seconds=run.wall_seconds,
            rows=committer.rows_committed,
            completion_fraction=ledger.completion_tokens / bound if can_stop and bound else None,
        )
    except OSError as e:  # a read-only cache never fails a job that finished its rows
        log.warning("could not save the device profile: %s", e)
