"""One Ray worker: an engine on one accelerator (or a few CPU cores) that turns blocks into shards.

Ray Data calls `BlockWorker` with batches of blocks; for each block the worker prepares the rows
(our renderer and tokenizer, per-row errors), generates, prices the rows by the wall time since
its previous commit (its model load is charged to its first block), and commits the block
itself: error fragment first, then the shard (see ray_blocks for the names). A block whose shard
is already visible was committed by a worker that died after committing: it is not redone.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from jobrunner.config import JobConfig
from jobrunner.executors.ray_blocks import (
    fragment_path,
    is_current_run,
    shard_path,
    unpack_block,
    write_fragment,
)
from jobrunner.io.readers import RawRow
from jobrunner.io.rundir import RunDir, read_ids
from jobrunner.io.writers import result_record, write_atomic
from jobrunner.prep.stream import copy_to_followers, dedup_key
from jobrunner.telemetry.cost import CostLedger, Savings
from jobrunner.telemetry.device import DeviceInfo, cpu_name, detect_device
from jobrunner.telemetry.prices import device_rate
from jobrunner.types import Request, Result, RowError


class BlockWorker:
    """Constructed once per Ray actor (the model loads here); called once per batch of blocks."""

    def __init__(
        self,
        cfg: JobConfig,
        run_path: str,
        fmt: str,
        tag: str,
        cpus: float,
        fault_marker: str | None = None,
    ) -> None:
        from jobrunner.engine.engines import make_engine
        from jobrunner.engine.loader import load_model
        from jobrunner.engine.quant import apply_quantization
        from jobrunner.formats import make_preparer

        t0 = time.monotonic()
        self.cfg, self.tag, self.fault_marker = cfg, tag, fault_marker
        self.rundir = RunDir(run_path, fmt)
        self.loaded = load_model(cfg.model)
        apply_quantization(
            self.loaded, cfg.model
        )  # the quality gate (quality_check) is not run here
        if self.loaded.device.type == "cpu" and not cfg.engine.num_threads:
            import torch

            torch.set_num_threads(max(1, int(cpus)))
        self.engine = make_engine(self.loaded, cfg)
        self.preparer = make_preparer(cfg, self.loaded.tokenizer)
        self.device = _worker_device(self.loaded.device.type, cpus)
        self.rate = device_rate(self.device, cfg.cost)
        self.usd_per_hour, self.price_source = self.rate.usd_per_hour, self.rate.label
        self.load_seconds = time.monotonic() - t0
        self.started = t0
        self.ledger = CostLedger(self.usd_per_hour, start=t0)  # blocks come one at a time
        self.savings = Savings()
        self.deduplicated = 0
        self.worker_id = f"{_node_ip()}:{os.getpid()}"

    def __call__(self, batch: Any) -> dict[str, list]:
        blocks = batch["block"].to_pylist()
        payloads = batch["payload"].to_pylist()
        return {
            "meta": [
                json.dumps(self.run_block(b, p)) for b, p in zip(blocks, payloads, strict=True)
            ]
        }

    # ------------------------------------------------------------------ one block

    def run_block(self, block: int, payload: bytes) -> dict[str, Any]:
        shard = shard_path(self.rundir, self.tag, block)
        if shard.exists():  # committed by a worker that died before reporting it
            return self._meta(block, shard, len(read_ids(shard)), None, 0.0, redone=False)
        rows, has_ids = unpack_block(payload)
        results, errors = self._generate(rows, has_ids)
        return self._commit(block, shard, results, errors)

    def _generate(
        self, rows: list[RawRow], has_ids: dict[str, bool]
    ) -> tuple[list[Result], list[RowError]]:
        self.preparer._file_has_ids.update(has_ids)  # decide ids exactly as the driver did
        prepared = self.preparer.prepare_batch(rows)
        errors = [p for p in prepared if isinstance(p, RowError)]
        leaders, followers = _dedup([p for p in prepared if isinstance(p, Request)])
        self.deduplicated += sum(len(f) for f in followers.values())
        results: list[Result] = []
        for r in self.engine.generate(leaders):
            results += [r, *copy_to_followers(r, followers.pop(r.id, []))]
        errors += [
            RowError(r.error_code or "error", r.error or "", r.source, r.id)
            for r in results
            if not r.ok
        ]
        return results, errors

    def _commit(self, block: int, shard, results: list[Result], errors: list[RowError]) -> dict:
        if not is_current_run(self.rundir, self.tag):
            raise RuntimeError(f"{self.rundir.path} is now run by another driver; not committing")
        before = self.ledger.cost_usd
        self.savings.add(self.ledger.price(results, self.engine.stats.row_seconds))
        usd = self.ledger.cost_usd - before
        if errors:
            write_fragment(fragment_path(self.rundir, self.tag, block), errors)
        if results:
            model = self.loaded.source.name
            write_atomic(
                [result_record(r, model) for r in results], shard, self.rundir.shards.write
            )
        self._fault_hook()
        ok = sum(r.ok for r in results)
        return self._meta(block, shard if results else None, len(results), ok, usd, redone=True)

    def _fault_hook(self) -> None:
        """Tests only: the first worker to commit a shard dies at once (one marker, one death)."""
        if not self.fault_marker:
            return
        try:
            os.close(os.open(self.fault_marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return
        os._exit(1)

    def _meta(
        self, block: int, shard, rows: int, ok: int | None, usd: float, redone: bool
    ) -> dict[str, Any]:
        st = self.engine.stats
        return {
            "block": block,
            "shard": shard.name if shard else None,
            "rows": rows,
            "succeeded": ok,
            "cost_usd": usd,
            "generated": redone,
            "worker": {
                "worker": self.worker_id,
                "device_name": self.device.name,
                "device_kind": self.device.kind,
                "device_count": self.device.count,
                "usd_per_hour": self.usd_per_hour,
                "price_source": self.price_source,
                "price_unit": self.rate.price.unit,
                "price_date": self.rate.price.date,
                "engine": self.engine.kind,
                "load_seconds": self.load_seconds,
                "alive_seconds": time.monotonic() - self.started,
                "engine_seconds": st.engine_seconds,
                "forward_seconds": st.forward_seconds,
                "steps": st.steps,
                "preemptions": st.preemptions,
                "oom_retries": st.oom_retries,
                "draft_tokens": st.draft_tokens,
                "accepted_draft_tokens": st.accepted_draft_tokens,
                "deduplicated": self.deduplicated,
                "notes": list(st.notes),
                **self.savings.to_json(),
            },
        }


def _dedup(reqs: list[Request]) -> tuple[list[Request], dict[str, list[Request]]]:
    """Exact duplicate greedy requests within the block run once (leader id -> followers)."""
    leaders: list[Request] = []
    by_key: dict[bytes, Request] = {}
    followers: dict[str, list[Request]] = {}
    for r in reqs:
        key = dedup_key(r)
        if key is not None and key in by_key:
            followers.setdefault(by_key[key].id, []).append(r)
            continue
        if key is not None:
            by_key[key] = r
        leaders.append(r)
    return leaders, followers


def _worker_device(kind: str, cpus: float) -> DeviceInfo:
    """What this worker holds: one GPU (Ray sets CUDA_VISIBLE_DEVICES), or `cpus` cores."""
    if kind == "cuda":
        gpu = detect_device()
        return DeviceInfo("cuda", gpu.name if gpu.kind == "cuda" else "GPU", 1)
    return DeviceInfo("cpu", cpu_name(), max(1, round(cpus)))


def _node_ip() -> str:
    try:
        import ray

        return ray.util.get_node_ip_address()
    except Exception:  # outside Ray (unit tests)
        return "local"
