"""The Ray executor: the same job on every GPU a Ray cluster has (one node or many).

The driver does what the local pipeline does before a model loads (lock, fingerprint, duplicate
ids, committed ids; see resume.open_run), cuts the input into blocks of `ray.block_rows`
pending rows (Parquet: from the id column alone, each block its file and row ranges, which the
worker reads itself; other formats: rows read with our readers and pickled), and streams them through a Ray Data actor pool: one BlockWorker
per GPU (`num_gpus=1`), or on a CPU-only cluster `ray.num_workers` workers of
`ray.cpus_per_worker` cores. Each worker commits its blocks' shards into the run directory
itself; only the driver writes manifest.json and errors.jsonl (ray_blocks explains the names).

Exactly once: Ray restarts a dead worker and retries its block; the block's shard name is
fixed, so a retry replaces rather than adds, and a block whose shard is visible is not redone.
Output path and input must be on a filesystem every node sees (NFS, EFS, Lustre, ...).
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import ray  # not installed: executors.run_with_executor says how to install it

from jobrunner import collector
from jobrunner.config import JobConfig
from jobrunner.errors import JobError
from jobrunner.executors.ray_blocks import (
    Plan,
    claim_run,
    clear_fragments,
    fragment_files,
    fragment_path,
    merge_errors,
    next_run_tag,
    plan_blocks,
)
from jobrunner.executors.ray_worker import BlockWorker
from jobrunner.io.rundir import Manifest, RunDir
from jobrunner.lifecycle import JobSummary, OpenRun, RunOptions, execute
from jobrunner.run_schema import to_json
from jobrunner.signals import raise_on_signal
from jobrunner.telemetry.device import cpu_count, detect_device
from jobrunner.telemetry.progress import Progress
from jobrunner.telemetry.record import RunRecord
from jobrunner.telemetry.run import save_timelines
from jobrunner.telemetry.sampler import energy_kwh
from jobrunner.telemetry.spill import SpillLog
from jobrunner.telemetry.timeline import ROW_COLUMNS, STEP_COLUMNS, telemetry_dir

log = logging.getLogger(__name__)

FAULT_ENV = "JOBRUNNER_RAY_FAULT_MARKER"  # tests only: see BlockWorker._fault_hook


def run(cfg: JobConfig, opts: RunOptions) -> JobSummary:
    """A job over a Ray cluster (a store output.path was refused by run_with_executor)."""
    return execute(cfg, opts, _run)


def _run(run: OpenRun) -> tuple[int, bool]:
    """Every pending block through the pool; (rows committed, stopped). Appends the run record."""
    collector.resume()  # `run` paused collections for its imports; the driver's loop is the job
    t0 = time.monotonic()
    run.ready()  # the driver commits merged errors below: the input is checked first
    cfg, rundir, manifest, landed = run.cfg, run.rundir, run.manifest, Landed()
    if run.opts.restart:
        clear_fragments(rundir)
    tag = next_run_tag(rundir)
    claim_run(rundir, tag)  # from here, workers of an earlier driver can no longer commit
    merge_errors(rundir, manifest, [], fragment_files(rundir))  # a crashed run's leftovers
    plan = plan_blocks(cfg, rundir.committed_idset(), cfg.ray.block_rows)
    interrupted = False
    if plan.blocks:
        started = _connect(cfg)
        progress = Progress(
            plan.rows,
            live=landed,
            prompt=landed,
            max_new_tokens=0 if cfg.task == "embed" else cfg.generation.max_new_tokens,
        )
        try:
            run.stop.reraise()  # a signal during ray.init whose exception Ray swallowed
            interrupted = _execute(cfg, rundir, manifest, plan, tag, landed, progress)
        finally:
            progress.close()
            if started:
                ray.shutdown()
    merge_errors(rundir, manifest, plan.errors, fragment_files(rundir))
    run_index = len(manifest.runs)
    landed.save_timelines(rundir, run_index)
    manifest.runs.append(landed.record(cfg, plan, time.monotonic() - t0).to_json())
    return landed.rows, interrupted


# ------------------------------------------------------------------ the cluster


def _connect(cfg: JobConfig) -> bool:
    """Join $RAY_ADDRESS (or ray.address), else start a local cluster. True if we started one."""
    if ray.is_initialized():
        return False
    quiet = {"logging_level": logging.WARNING, "log_to_driver": False}
    address = cfg.ray.address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, **quiet)
        return True
    wanted = (cfg.ray.num_workers or 0) * cfg.ray.cpus_per_worker
    # One spare CPU so Ray Data's own tasks never wait behind the workers.
    ray.init(num_cpus=int(max(cpu_count(), wanted)) + 1, include_dashboard=False, **quiet)
    return True


def pool_size(cfg: JobConfig, resources: dict[str, float]) -> tuple[int, float, float]:
    """(workers, cpus per worker, gpus per worker) for this cluster's resources."""
    gpus = int(resources.get("GPU", 0)) if cfg.model.device != "cpu" else 0
    cpus = cfg.ray.cpus_per_worker
    if gpus:
        return cfg.ray.num_workers or gpus, min(cpus, resources.get("CPU", 1) / gpus), 1.0
    spare = max(resources.get("CPU", 1) - 1, cpus)
    return cfg.ray.num_workers or max(1, int(spare // cpus)), cpus, 0.0


def _execute(
    cfg: JobConfig,
    rundir: RunDir,
    manifest: Manifest,
    plan: Plan,
    tag: str,
    landed: Landed,
    progress: Progress,
) -> bool:
    """Stream the blocks through the worker pool; record each block as it lands. True if stopped."""
    rows = iter(_dataset(cfg, rundir, plan, tag).iter_rows())
    try:
        with raise_on_signal(_stopped) as stopped:
            for row in rows:
                _land(rundir, manifest, tag, json.loads(row["meta"]), landed, progress)
            stopped.reraise()  # a signal Ray's iterator swallowed still stops the run
    except _Stopped:
        return True
    finally:
        getattr(rows, "close", lambda: None)()  # shuts the pipeline and its workers down
    return False


def _dataset(cfg: JobConfig, rundir: RunDir, plan: Plan, tag: str):
    """The blocks mapped through a pool of BlockWorkers sized to the cluster."""
    import ray.data

    workers, cpus, gpus = pool_size(cfg, ray.cluster_resources())
    workers = min(workers, len(plan.blocks))
    log.info(
        "ray: %d rows in %d blocks on %d workers (%s CPU, %s GPU each)",
        plan.rows,
        len(plan.blocks),
        workers,
        cpus,
        gpus,
    )
    ray.data.DataContext.get_current().enable_progress_bars = False
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    return ray.data.from_items(plan.blocks, override_num_blocks=len(plan.blocks)).map_batches(
        BlockWorker,
        batch_size=1,
        batch_format="pyarrow",
        compute=ray.data.ActorPoolStrategy(size=workers),
        num_cpus=cpus,
        num_gpus=gpus,
        fn_constructor_kwargs={
            "cfg": _worker_cfg(cfg),
            "run_path": str(rundir.path.resolve()),
            "fmt": rundir.fmt,
            "tag": tag,
            "cpus": cpus,
            "fault_marker": os.environ.get(FAULT_ENV),
            "schema": to_json(rundir.schema) if rundir.schema is not None else None,
        },
    )


def _land(
    rundir: RunDir,
    manifest: Manifest,
    tag: str,
    meta: dict[str, Any],
    landed: Landed,
    progress: Progress,
) -> None:
    """A committed block: into manifest.json, its error fragment into errors.jsonl."""
    if "failure" in meta:  # a worker could not start (the quality gate): the job's answer
        err = JobError(meta["failure"]["message"])
        err.exit_code = meta["failure"]["exit_code"]
        raise err
    landed.add(meta)
    if meta["shard"] and all(s["name"] != meta["shard"] for s in manifest.shards):
        manifest.shards.append(
            {"name": meta["shard"], "rows": meta["rows"], "bytes": meta.get("bytes")}
        )
        ok = meta["succeeded"] if meta["succeeded"] is not None else meta["rows"]
        manifest.counts["succeeded"] = manifest.counts.get("succeeded", 0) + ok
    fragment = fragment_path(rundir, tag, meta["block"])
    if fragment.exists():  # most blocks have no failed rows
        merge_errors(rundir, manifest, [], [fragment])
    rundir.save_manifest(manifest)
    progress.add(meta["rows"], meta.get("completion_tokens", 0))
    log.debug("ray: block %d committed by %s", meta["block"], meta["worker"])


def _worker_cfg(cfg: JobConfig) -> JobConfig:
    """Workers may start elsewhere: a local model directory travels as an absolute path, and
    `cuda:N` becomes `cuda` (Ray gives each worker its own GPU as its only visible one)."""
    out = cfg.model_copy(deep=True)
    if cfg.model.device.startswith("cuda"):
        out.model.device = "cuda"
    if Path(cfg.model.source).expanduser().exists():
        out.model.source = str(Path(cfg.model.source).expanduser().resolve())
    return out


class _Stopped(Exception):
    pass


def _stopped(signum: int) -> Exception:
    """While blocks run: stop waiting; committed blocks stay, the rest is redone next time."""
    log.warning("signal %s: keeping committed blocks and exiting", signum)
    return _Stopped()


# ----------------------------------------------------------------- the record


class Landed:
    """What the landed blocks told the driver: each worker's latest record (a restarted worker
    is a new one), its rows, blocks and cost, and the timeline rows workers sent.

    Progress reads it as a local run's prep stream and engine counters: a landed row's prompt
    is done (`prefill_tokens`), and the prompts to come are estimated from the landed ones."""

    read_done = False  # the driver does not read prompts: their total stays an estimate

    def __init__(self) -> None:
        self.workers: dict[str, dict[str, Any]] = {}
        self.steps = SpillLog(STEP_COLUMNS)  # bounded memory on the driver, any job size
        self.samples: list[dict[str, Any]] = []
        self.row_records = SpillLog(ROW_COLUMNS)
        self.rows = 0
        self.prompt_tokens = 0  # of the landed rows

    @property
    def rows_read(self) -> int:
        return self.rows

    @property
    def prefill_tokens(self) -> int:
        return self.prompt_tokens

    def add(self, meta: dict[str, Any]) -> None:
        prev = self.workers.get(meta["worker"], {"rows": 0, "blocks": 0, "cost_usd": 0.0})
        self.workers[meta["worker"]] = {
            "record": meta["record"],
            "rows": prev["rows"] + meta["rows"],
            "blocks": prev["blocks"] + 1,
            "cost_usd": prev["cost_usd"] + meta["cost_usd"],
        }
        self.steps += meta.get("steps", [])
        self.samples += meta.get("samples", [])
        self.row_records += meta.get("row_records", [])
        self.rows += meta["rows"]
        self.prompt_tokens += meta.get("prompt_tokens", 0)

    def record(self, cfg: JobConfig, plan: Plan, wall: float) -> RunRecord:
        """One record for this invocation (the report's sums stay right), workers broken down."""
        records = [RunRecord.from_json(w["record"]) for w in self.workers.values()]
        per_worker = [
            {"worker": k, **w["record"], **{n: w[n] for n in ("rows", "blocks", "cost_usd")}}
            for k, w in self.workers.items()
        ]
        merged = RunRecord.merge(
            records,
            executor="ray",
            wall_seconds=wall,
            skipped=plan.skipped,
            workers=per_worker,
            energy_kwh=energy_kwh(self.samples),
        )
        if not records:  # nothing ran: the driver's own figures
            local = detect_device()
            merged = replace(
                merged,
                job=cfg.name,
                model=cfg.model.source,
                engine=cfg.engine.kind,
                device_name=local.name,
                device_kind=local.kind,
                device_count=local.count,
            )
        return merged

    def save_timelines(self, rundir: RunDir, run_index: int) -> None:
        """The workers' step and device rows, tagged with their worker, under this run."""
        tdir = telemetry_dir(rundir.path)
        save_timelines(tdir, run_index, self.samples, self.steps, self.row_records)
