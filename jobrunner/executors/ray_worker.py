"""One Ray worker: an engine on one accelerator (or a few CPU cores) that turns blocks into shards.

It starts its engine as the local run does (`start_engine`: load, quality gate, quantization,
engine check), prepares each block with the local run's `Prep` (per-row errors, dedup, prefix
ordering) and prices and commits it with the local run's `Committer`, whose writes go to the
block's own names: error fragment first, then the shard (see ray_blocks). Its model load is
charged to its first block. A block whose shard is already visible was committed by a worker
that died after committing: it is not redone. Each block's answer (`meta`) carries the worker's
run record and its new step and device timeline rows, which the driver merges.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from jobrunner.config import JobConfig
from jobrunner.errors import JobError
from jobrunner.executors.ray_blocks import (
    fragment_path,
    is_current_run,
    shard_path,
    unpack_block,
    write_fragment,
)
from jobrunner.io.committer import Committer
from jobrunner.io.rundir import RunDir, read_ids
from jobrunner.io.writers import write_atomic
from jobrunner.prep.stream import Prep
from jobrunner.run_schema import from_json
from jobrunner.telemetry.device import DeviceInfo, cpu_name, detect_device
from jobrunner.telemetry.prices import device_rate
from jobrunner.telemetry.record import RunRecord
from jobrunner.telemetry.sampler import DEFAULT_INTERVAL, Sampler
from jobrunner.types import Result, RowError


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
        schema: dict[str, Any] | None = None,
    ) -> None:
        from jobrunner.engine.start import start_engine

        t0 = time.monotonic()
        self.cfg, self.tag, self.fault_marker = cfg, tag, fault_marker
        self.worker_id = f"{_node_ip()}:{os.getpid()}"
        self.rundir = RunDir(run_path, fmt)
        self.rundir.schema = from_json(schema) if schema else None  # the driver's, as decided
        self.sampler = Sampler(float(os.environ.get("JOBRUNNER_SAMPLE_INTERVAL", DEFAULT_INTERVAL)))
        self.sampler.start()
        self.failure: dict[str, Any] | None = None
        try:  # a failed start (the quality gate: 65) is the job's answer, given by the driver
            self.started = start_engine(cfg, since=t0, cpu_threads=int(cpus))
        except JobError as e:
            self.failure = {"error": type(e).__name__, "message": str(e), "exit_code": e.exit_code}
            return
        self.engine = self.started.engine
        grammar = getattr(self.engine, "compile_grammar", None)
        self.prep = Prep(cfg, self.started.loaded.tokenizer, compile_grammar=grammar)
        self.device = _worker_device(self.started.loaded.device.type, cpus)
        self.rate = device_rate(self.device, cfg.cost)
        self.committer = Committer(  # one commit per block, when the block is done
            self._write,
            self.started.loaded.source.name,
            self.rate.usd_per_hour,
            shard_rows=1 << 62,
            shard_seconds=float("inf"),
            drain_errors=self.prep.drain_errors,
            measured_seconds=lambda: self.engine.stats.row_seconds,
        )
        self.committer.start_clock(since=t0)
        self.t0 = t0
        self._block: int | None = None
        self._sent_steps = self._sent_samples = self._sent_rows = 0

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
        if self.failure:
            return {"block": block, "failure": self.failure}
        shard = shard_path(self.rundir, self.tag, block)
        if shard.exists():  # committed by a worker that died before reporting it
            return self._meta(block, shard, len(read_ids(shard)), None, 0.0, [])
        rows, has_ids = unpack_block(payload, self.cfg.input.batch_rows)
        self.prep.preparer.adopt_file_ids(has_ids)  # decide ids exactly as the driver did
        results: list[Result] = []
        for r in self.engine.generate(self.prep.requests(rows)):
            done = [r, *self.prep.fan_out(r)]
            self.committer.add(done)
            results += done
        self._block = block
        usd = self.committer.commit()
        self._fault_hook()
        ok = sum(r.ok for r in results)
        return self._meta(block, shard if results else None, len(results), ok, usd, results)

    def _write(self, records: list[dict[str, Any]], errors: list[RowError], sources: list) -> None:
        """The committer's writes for the current block: its error fragment, then its shard."""
        if not is_current_run(self.rundir, self.tag):
            raise RuntimeError(f"{self.rundir.path} is now run by another driver; not committing")
        if errors:
            write_fragment(fragment_path(self.rundir, self.tag, self._block), errors)
        if records:
            shard = shard_path(self.rundir, self.tag, self._block)
            write_atomic(records, shard, self.rundir.write)

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
        self, block: int, shard, rows: int, ok: int | None, usd: float, results: list[Result]
    ) -> dict[str, Any]:
        record = RunRecord.of_engine(
            self.cfg,
            self.started,
            self.device,
            self.rate,
            executor="ray",
            wall_seconds=time.monotonic() - self.t0,
            deduplicated=self.prep.deduplicated,
            **self.committer.savings.to_json(),
        )
        return {
            "block": block,
            "shard": shard.name if shard else None,
            "bytes": shard.stat().st_size if shard else None,  # as the local commit records
            "rows": rows,
            "succeeded": ok,
            "cost_usd": usd,
            "prompt_tokens": sum(r.usage.prompt_tokens for r in results),
            "completion_tokens": sum(r.usage.completion_tokens for r in results),
            "worker": self.worker_id,
            "record": record.to_json(),
            "steps": self._new_steps(),
            "samples": self._new_samples(),
            "row_records": self._new_rows(),
        }

    def _new_steps(self) -> list[dict[str, Any]]:
        log = self.engine.stats.step_log
        new, self._sent_steps = log[self._sent_steps :], len(log)
        return [{**s, "worker": self.worker_id} for s in new]

    def _new_rows(self) -> list[dict[str, Any]]:
        rows = self.committer.row_log
        new, self._sent_rows = rows[self._sent_rows :], len(rows)
        return new

    def _new_samples(self) -> list[dict[str, Any]]:
        samples = self.sampler.samples
        new, self._sent_samples = samples[self._sent_samples :], len(samples)
        return [{**s, "device": f"{self.worker_id} {s['device']}"} for s in new]


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
