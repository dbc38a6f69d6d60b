"""Memory and speed at corpus scale: peak RSS of `validate`, of a run until its first result,
and of a resume with rows already committed; preparation rows/s; engine step time with the
preparation stage running and without.

    python scripts/bench_scale.py --workdir /work/scale --rows 100000000 --validate-rows 1000000 \
        --committed 50000000

Each measurement is a fresh `jobrunner` subprocess; peak RSS is the kernel's high-water mark
(VmHWM, or wait4's ru_maxrss). A first result needs max_new_tokens: 1, so it is the first token.
The baseline is the same run over 1,000 rows: what the model and the KV cache take.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-c", "from jobrunner.cli import main; main()"]
ENV = {**os.environ, "JOBRUNNER_NO_PROGRESS": "1", "HF_HUB_OFFLINE": "1"}


def corpus(workdir: Path, rows: int) -> Path:
    path = workdir / f"corpus-{rows}.parquet"
    if not path.exists():
        subprocess.run(
            [sys.executable, str(ROOT / "scripts/make_corpus.py"), str(path), "--rows", str(rows)],
            check=True,
        )
    return path


def job(workdir: Path, data: Path, out: str) -> Path:
    spec = {
        "name": "scale",
        "input": {"path": str(data)},
        "generation": {"max_new_tokens": 1},
        "output": {"path": str(workdir / out), "shard_rows": 1, "shard_seconds": 0.01},
        "engine": {"max_num_seqs": 16, "kv_cache_bytes": 64 << 20},
    }
    path = workdir / f"{out}.yaml"
    path.write_text(json.dumps(spec))
    return path


def validate(job_file: Path) -> dict:
    t = time.monotonic()
    proc = subprocess.Popen(
        [*CLI, "validate", str(job_file)], env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.monotonic() - t
    rows = json.loads(proc.stdout.read().decode().strip().splitlines()[-1])["rows"]
    return {
        "rows": rows,
        "seconds": wall,
        "rows_per_s": rows / wall,
        "peak_rss_mb": usage.ru_maxrss / 1024,
    }


def first_result(job_file: Path, results: Path, before: frozenset = frozenset()) -> dict:
    """Start `jobrunner run`; the first token is its "first result" log line; stop it when it
    commits a shard not in `before` (its first commit comes after the input check)."""
    t = time.monotonic()
    proc = subprocess.Popen(
        [*CLI, "run", str(job_file)], env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    seen: dict[str, float] = {}
    tail: list[str] = []

    def watch() -> None:
        for line in proc.stderr:
            text = line.decode(errors="replace")
            tail.append(text)
            if "first result" in text and "first" not in seen:
                seen["first"] = time.monotonic() - t

    reader = threading.Thread(target=watch, daemon=True)
    reader.start()
    peak = 0
    while not (set(results.glob("part-*")) - before):
        if proc.poll() is not None:
            reader.join(5)
            raise RuntimeError("".join(tail)[-3000:])
        peak = max(peak, _hwm(proc.pid))
        time.sleep(0.05)
    wall = time.monotonic() - t
    peak = max(peak, _hwm(proc.pid))
    proc.kill()
    proc.wait()
    return {
        "seconds_to_first_token": round(seen.get("first", wall), 2),
        "seconds_to_first_commit": round(wall, 2),
        "peak_rss_mb": round(peak / 1024),
    }


def _hwm(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def committed_run_dir(job_file: Path, committed: int, ranges: bool = True) -> None:
    """A run directory of this job with its first `committed` rows done (synthetic shards);
    `ranges`: with each shard's row ranges, as a run's commits write them."""
    sys.path.insert(0, str(ROOT))
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from jobrunner.config import load_job
    from jobrunner.io.rundir import RunDir
    from jobrunner.pipeline import RunOptions
    from jobrunner.resume import open_run

    cfg = load_job(job_file)
    rundir = RunDir(cfg.output.path)
    with open_run(rundir, cfg, RunOptions()):
        pass  # the manifest now holds this job's fingerprint
    step = 1_000_000
    for k, start in enumerate(range(0, committed, step)):
        n = min(step, committed - start)
        num = pc.cast(pa.array(np.arange(start, start + n)), pa.string())
        ids = pc.binary_join_element_wise("r", pc.utf8_lpad(num, 9, "0"), "")
        table = pa.table(
            {
                "id": ids,
                "completion": pa.array(["x"] * n),
                "finish_reason": pa.array(["length"] * n),
                "prompt_tokens": pa.array(np.full(n, 40)),
                "cached_tokens": pa.array(np.zeros(n, np.int64)),
                "completion_tokens": pa.array(np.ones(n, np.int64)),
                "cost_usd": pa.array(np.zeros(n)),
                "model": pa.array(["m"] * n),
            }
        )
        pq.write_table(table, rundir.results / f"part-{k:05d}.parquet")
        if ranges:  # what a run's commit records beside its shard (io/row_ranges.py)
            row_ranges(rundir.path, f"part-{k:05d}.parquet", str(cfg.input.path), start, n)


def row_ranges(run_path: Path, shard: str, file: str, start: int, n: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    (run_path / "rows").mkdir(exist_ok=True)
    table = pa.table(
        {
            "file": pa.array([file]).dictionary_encode(),
            "start": pa.array([start], pa.int64()),
            "stop": pa.array([start + n], pa.int64()),
        }
    )
    pq.write_table(table, run_path / "rows" / shard)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", type=Path, required=True)
    ap.add_argument("--rows", type=int, default=100_000_000)
    ap.add_argument("--validate-rows", type=int, default=1_000_000)
    ap.add_argument("--committed", type=int, default=50_000_000)
    ap.add_argument("--only", default="validate,baseline,first,resume")
    ap.add_argument(
        "--no-ranges",
        action="store_true",
        help="the resume directory without row ranges (as runs before io/row_ranges.py left it)",
    )
    args = ap.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    only = set(args.only.split(","))
    out: dict = {"cpu_count": os.cpu_count()}
    if "validate" in only:
        out["validate"] = validate(job(args.workdir, corpus(args.workdir, args.validate_rows), "v"))
        print(json.dumps(out), flush=True)
    if "baseline" in only:
        j = job(args.workdir, corpus(args.workdir, 1000), "base")
        out["baseline_1k_rows"] = first_result(j, args.workdir / "base" / "results")
        print(json.dumps(out), flush=True)
    big = corpus(args.workdir, args.rows) if only & {"first", "resume"} else None
    if "first" in only:
        j = job(args.workdir, big, "first")
        out[f"first_token_{args.rows}_rows"] = first_result(j, args.workdir / "first" / "results")
        print(json.dumps(out), flush=True)
    if "resume" in only:
        j = job(args.workdir, big, "resume")
        committed_run_dir(j, args.committed, ranges=not args.no_ranges)
        res = args.workdir / "resume" / "results"
        before = frozenset(res.glob("part-*"))
        out[f"resume_{args.committed}_committed"] = first_result(j, res, before)
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
