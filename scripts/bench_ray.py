"""Rows per second of the Ray executor with 1, 2, ... workers, in one run on one local cluster.

    python scripts/bench_ray.py --rows 32 --max-new-tokens 32 --workers 1,2

Each worker is one engine: on a GPU machine one GPU each, on a CPU-only machine
`--cpus-per-worker` cores each (torch threads). The same short prompts (from data/samples) run
once per worker count into a fresh run directory; `rows/s` is rows over the driver's wall time
(worker start-up and model load included), `rows/s after load` leaves out the slowest worker's
load. A local-executor run of the same job is printed for reference (`--no-local` skips it).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def make_input(path: Path, rows: int) -> None:
    prompts = []
    with open(ROOT / "data" / "samples" / "prompts.jsonl", encoding="utf-8") as f:
        for line in f:
            p = json.loads(line)["prompt"]
            if len(p) < 200:
                prompts.append(p)
    with open(path, "w", encoding="utf-8") as f:
        for i in range(rows):
            f.write(json.dumps({"id": f"b{i:05d}", "prompt": prompts[i % len(prompts)]}) + "\n")


def job(args, src: Path, out: Path, executor: str, workers: int) -> dict:
    return {
        "model": {"dtype": args.dtype},
        "input": {"path": str(src)},
        "generation": {"max_new_tokens": args.max_new_tokens, "ignore_eos": True},
        "engine": {"kind": args.engine},
        "output": {"path": str(out), "format": "jsonl"},
        "executor": executor,
        "ray": {
            "num_workers": workers,
            "cpus_per_worker": args.cpus_per_worker,
            "block_rows": args.block_rows,
        },
    }


def timed(data: dict) -> dict:
    from jobrunner.config import JobConfig
    from jobrunner.executors import run_with_executor
    from jobrunner.pipeline import RunOptions

    t0 = time.perf_counter()
    summary = run_with_executor(JobConfig.model_validate(data), RunOptions(restart=True))
    wall = time.perf_counter() - t0
    run = json.loads((Path(data["output"]["path"]) / "manifest.json").read_text())["runs"][-1]
    rows = summary.rows["succeeded"]
    load = run.get("load_seconds", 0.0)
    return {
        "rows": rows,
        "wall_s": wall,
        "load_s": load,
        "rows_per_s": rows / wall,
        "rows_per_s_after_load": rows / max(wall - load, 1e-9),
        "workers": len(run.get("workers", [])) or None,
        "cost_usd": summary.cost_usd,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--workers", default="1,2", help="worker counts to compare")
    ap.add_argument("--cpus-per-worker", type=float, default=1.0)
    ap.add_argument("--block-rows", type=int, default=4)
    ap.add_argument("--engine", default="static", choices=["static", "paged"])
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--no-local", action="store_true")
    args = ap.parse_args()
    os.environ.setdefault("JOBRUNNER_NO_PROGRESS", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    logging.basicConfig(level=logging.WARNING)
    counts = [int(x) for x in args.workers.split(",")]

    import ray

    t0 = time.perf_counter()
    if not ray.is_initialized():  # one cluster for every measurement; RAY_ADDRESS joins one
        need = int(max(counts) * args.cpus_per_worker) + 1
        ray.init(
            num_cpus=need,
            include_dashboard=False,
            logging_level=logging.WARNING,
            log_to_driver=False,
        )
    print(f"cluster up in {time.perf_counter() - t0:.1f}s: {ray.cluster_resources()}")
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "in.jsonl"
        make_input(src, args.rows)
        results = {}
        if not args.no_local:
            results["local"] = timed(job(args, src, Path(tmp) / "local", "local", 1))
        for n in counts:
            results[f"ray x{n}"] = timed(job(args, src, Path(tmp) / f"ray{n}", "ray", n))
    print(
        f"{args.rows} rows, {args.max_new_tokens} new tokens each, {args.engine} engine, "
        f"{args.dtype}, {args.cpus_per_worker} cpus/worker, {args.block_rows} rows/block"
    )
    print(f"{'run':>10} {'rows':>5} {'wall s':>7} {'load s':>7} {'rows/s':>7} {'after load':>10}")
    for name, r in results.items():
        print(
            f"{name:>10} {r['rows']:>5} {r['wall_s']:>7.1f} {r['load_s']:>7.1f}"
            f" {r['rows_per_s']:>7.2f} {r['rows_per_s_after_load']:>10.2f}"
        )
    print(json.dumps(results))
    ray.shutdown()


if __name__ == "__main__":
    main()
