"""The Ray executor: the same job on every GPU a Ray cluster has (one node or many).

The driver does what the local pipeline does before a model loads (lock, fingerprint, duplicate
ids, committed ids; see resume.open_run), reads the input with our readers into blocks of
`ray.block_rows` pending rows, and streams them through a Ray Data actor pool: one BlockWorker
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
from pathlib import Path
from typing import Any

import ray  # not installed: executors.run_with_executor says how to install it

from jobrunner.config import JobConfig
from jobrunner.errors import ConfigError, Interrupted
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
from jobrunner.formats import output_format
from jobrunner.io.fs import is_remote
from jobrunner.io.rundir import Manifest, RunDir
from jobrunner.pipeline import JobSummary, RunOptions, finish_run
from jobrunner.resume import check_same_job, open_run
from jobrunner.signals import SignalLatch, raise_on_signal
from jobrunner.telemetry.device import cpu_count, detect_device
from jobrunner.telemetry.report import ENGINE_COUNTERS, write_reports

log = logging.getLogger(__name__)

FAULT_ENV = "JOBRUNNER_RAY_FAULT_MARKER"  # tests only: see BlockWorker._fault_hook


def run(cfg: JobConfig, opts: RunOptions) -> JobSummary:
    out = output_format(cfg.output.format)
    if is_remote(cfg.output.path):
        raise ConfigError(
            f"output.path {cfg.output.path}: executor ray writes a local run directory; object"
            " stores take executor local (docs/DESIGN.md, object stores)"
        )
    rundir = RunDir(cfg.output.path, out.shard_format, out.error_record)
    if rundir.finished and not opts.restart and not (opts.retry_errors and rundir.has_errors):
        check_same_job(rundir, cfg)  # as the local executor: a changed job is refused (78)
        return finish_run(cfg, rundir, None)
    with raise_on_signal(_interrupted) as stop, open_run(rundir, cfg, opts) as (manifest, _, _n):
        return _run(cfg, rundir, manifest, opts, stop)


def _run(
    cfg: JobConfig, rundir: RunDir, manifest: Manifest, opts: RunOptions, stop: SignalLatch
) -> JobSummary:
    t0 = time.monotonic()
    if opts.restart:
        clear_fragments(rundir)
    tag = next_run_tag(rundir)
    claim_run(rundir, tag)  # from here, workers of an earlier driver can no longer commit
    merge_errors(rundir, manifest, [], fragment_files(rundir))  # a crashed run's leftovers
    plan = plan_blocks(cfg, rundir.committed_ids(), cfg.ray.block_rows)
    metas: list[dict[str, Any]] = []
    interrupted = False
    if plan.blocks:
        started = _connect(cfg)
        try:
            stop.reraise()  # a signal during ray.init whose exception Ray swallowed
            interrupted = _execute(cfg, rundir, manifest, plan, tag, metas)
        finally:
            if started:
                ray.shutdown()
    merge_errors(rundir, manifest, plan.errors, fragment_files(rundir))
    _record_run(manifest, cfg, plan, metas, time.monotonic() - t0)
    rundir.save_manifest(manifest)
    if interrupted:
        write_reports(rundir)
        raise Interrupted(
            f"interrupted: the committed blocks are kept in {rundir.path}; run the"
            " same command again to continue"
        )
    return finish_run(cfg, rundir, manifest)


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
    metas: list[dict[str, Any]],
) -> bool:
    """Stream the blocks through the worker pool; record each block as it lands. True if stopped."""
    import ray.data

    from jobrunner.executors.ray_worker import BlockWorker

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
    ds = ray.data.from_items(plan.blocks, override_num_blocks=len(plan.blocks)).map_batches(
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
        },
    )
    rows = iter(ds.iter_rows())
    try:
        with raise_on_signal(_stopped) as stopped:
            for row in rows:
                _land(rundir, manifest, tag, json.loads(row["meta"]), metas, plan.rows)
            stopped.reraise()  # a signal Ray's iterator swallowed still stops the run
    except _Stopped:
        return True
    finally:
        getattr(rows, "close", lambda: None)()  # shuts the pipeline and its workers down
    return False


def _land(
    rundir: RunDir,
    manifest: Manifest,
    tag: str,
    meta: dict[str, Any],
    metas: list[dict[str, Any]],
    total: int,
) -> None:
    """A committed block: into manifest.json, its error fragment into errors.jsonl."""
    metas.append(meta)
    if meta["shard"] and all(s["name"] != meta["shard"] for s in manifest.shards):
        manifest.shards.append({"name": meta["shard"], "rows": meta["rows"]})
        ok = meta["succeeded"] if meta["succeeded"] is not None else meta["rows"]
        manifest.counts["succeeded"] = manifest.counts.get("succeeded", 0) + ok
    fragment = fragment_path(rundir, tag, meta["block"])
    if fragment.exists():  # most blocks have no failed rows
        merge_errors(rundir, manifest, [], [fragment])
    rundir.save_manifest(manifest)
    done = sum(m["rows"] for m in metas)
    log.info(
        "ray: block %d committed by %s (%d/%d rows)",
        meta["block"],
        meta["worker"]["worker"],
        done,
        total,
    )


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


def _interrupted(signum: int) -> Exception:
    return Interrupted(
        f"signal {signum}: stopped; committed rows are kept, run the same command again to continue"
    )


# ----------------------------------------------------------------- the record


def _record_run(
    manifest: Manifest, cfg: JobConfig, plan: Plan, metas: list[dict[str, Any]], wall: float
) -> None:
    """One record for this invocation (the report's sums stay right), workers broken down.

    engine/forward seconds are the mean per worker, so busy fractions stay per device;
    device_count and usd_per_hour are the whole pool's.
    """
    ws = _per_worker(metas)
    n = len(ws) or 1
    local = detect_device()
    first = ws[0] if ws else {}
    manifest.runs.append(
        {
            "job": cfg.name,
            "model": cfg.model.source,
            "executor": "ray",
            "engine": first.get("engine", cfg.engine.kind),
            "wall_seconds": wall,
            "load_seconds": max((w["load_seconds"] for w in ws), default=0.0),
            "engine_seconds": sum(w["engine_seconds"] for w in ws) / n,
            "forward_seconds": sum(w["forward_seconds"] for w in ws) / n,
            **{
                k: sum(w[k] for w in ws)
                for k in (*ENGINE_COUNTERS, "cache_saved_usd", "dedup_saved_usd")
            },
            "skipped": plan.skipped,
            "device_name": first.get("device_name", local.name),
            "device_kind": first.get("device_kind", local.kind),
            "device_count": sum(w["device_count"] for w in ws) or local.count,
            "usd_per_hour": sum(w["usd_per_hour"] for w in ws),
            "price_source": first.get("price_source", ""),
            "price_unit": first.get("price_unit"),
            "price_date": first.get("price_date"),
            "notes": sorted({x for w in ws for x in w["notes"]}),
            "workers": ws,
            "finished_at": time.time(),
        }
    )


def _per_worker(metas: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The latest stats of each worker (a restarted worker is a new one), with its rows."""
    out: dict[str, dict[str, Any]] = {}
    for m in metas:
        w = m["worker"]
        prev = out.get(w["worker"], {"rows": 0, "blocks": 0, "cost_usd": 0.0})
        out[w["worker"]] = {
            **w,
            "rows": prev["rows"] + m["rows"],
            "blocks": prev["blocks"] + 1,
            "cost_usd": prev["cost_usd"] + m["cost_usd"],
        }
    return list(out.values())
