"""Estimate against actual: `jobrunner estimate` before each run, the run's report after.

Workloads (the same model and engine settings, so they share one device profile):
  mixed       prompts of mixed lengths (100..400 tokens), ignore_eos, --new-tokens each
  shared      short questions behind one long shared system prompt, ignore_eos (prefix cache)
  quickstart  jobs/quickstart.yaml as it is (EOS honoured, 64 new tokens)

First `jobrunner estimate --calibrate N` measures this device into a fresh profile directory
(the cache a user's first calibration would fill); then for each workload an uncalibrated
estimate, the run in a fresh process, and the estimate's error on wall time and cost as the
run's report states it. Each run adds its steps to the profile, as every run does.

Other jobs on the machine change its speed from minute to minute, which no estimate can know.
So the bench waits (up to --wait seconds) for the 1-minute load average to fall below
--quiet-below before each workload, prints the load average around each run, and separates the
two errors: `speed` is the run's measured step time over what the estimate's step model says
for those same steps (1.00: the machine ran as fast as when the profile was measured; `prefill`
and `decode` the same for the steps that compute prompt tokens and for those that only
decode, which tells a term the model misses from a machine that ran slower overall), and
`at run speed` is the wall-time error once the forward time is scaled by it, the error of the
model itself (the replayed steps, the step-time terms, load and overheads).

    python scripts/bench_estimate.py                 # 24 rows each, the whole quickstart
    python scripts/bench_estimate.py --rows 16 --quickstart-rows 64
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq
import yaml

from jobrunner.telemetry.throughput import StepModel

ROOT = Path(__file__).resolve().parent.parent
ENGINE = "engine: {kind: paged}"
MODEL = "model: {source: smollm2-135m-instruct, dtype: auto, max_model_len: 4096}"


def texts() -> list[str]:
    table = pq.read_table(ROOT / "data/samples/prompts.parquet", columns=["prompt"])
    return [t for t in table.column(0).to_pylist() if t]


def write_rows(path: Path, prompts: list[str]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for i, p in enumerate(prompts):
            f.write(json.dumps({"id": f"r{i}", "prompt": p}) + "\n")


def mixed(rows: int) -> list[str]:
    """Mixed lengths: each prompt cut to a random 400..1600 characters (about 100..400 tokens)."""
    rng, pool = random.Random(0), [t for t in texts() if len(t) >= 400]
    out = []
    while len(out) < rows:
        t = pool[len(out) % len(pool)]
        out.append((t * (1 + 1600 // len(t)))[: rng.randint(400, 1600)])
    return out


def shared(rows: int) -> list[str]:
    head = "You are a careful assistant. Follow these rules. " + " ".join(texts()[:3])[:1500]
    questions = [t for t in texts() if len(t) < 200]
    return [f"{head}\n\nQuestion: {questions[i % len(questions)]}" for i in range(rows)]


def job_text(name: str, data: Path, out: Path, new_tokens: int, ignore_eos: bool) -> str:
    return (
        f"name: {name}\n{MODEL}\n"
        f"input: {{path: {data}, id_column: id, prompt: {{column: prompt}}}}\n"
        f"generation: {{max_new_tokens: {new_tokens}, temperature: 0.0,"
        f" ignore_eos: {str(ignore_eos).lower()}}}\n"
        f"output: {{path: {out}, format: parquet}}\n{ENGINE}\n"
    )


def quickstart_job(tmp: Path, rows: int | None) -> Path:
    data = ROOT / "data/samples/prompts.parquet"
    if rows:
        sub = tmp / "quickstart.parquet"
        pq.write_table(pq.read_table(data).slice(0, rows), sub)
        data = sub
    job = yaml.safe_load((ROOT / "jobs/quickstart.yaml").read_text())
    job["input"]["path"] = str(data)  # absolute: the job file moves to tmp
    job["output"]["path"] = str(tmp / "out-quickstart")
    path = tmp / "quickstart.yaml"
    path.write_text(yaml.safe_dump(job, sort_keys=False))
    return path


def cli(*args: str, env: dict) -> dict:
    p = subprocess.run(
        [sys.executable, "-m", "jobrunner", *args], capture_output=True, text=True, env=env
    )
    if p.returncode != 0:
        raise SystemExit(f"jobrunner {' '.join(args)} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def wait_for_quiet(below: float, wait: float) -> float:
    """The 1-minute load average, once it is below `below` or `wait` seconds have passed."""
    end = time.monotonic() + wait
    while os.getloadavg()[0] >= below and time.monotonic() < end:
        time.sleep(5)
    return os.getloadavg()[0]


def speed(out: Path, throughput: dict) -> tuple[float, float, float]:
    """The run's measured step seconds over the estimate's step model on the same steps: all
    of them, those that compute prompt tokens, and those that only decode."""
    model = StepModel(**throughput)
    steps = pq.read_table(out / "telemetry" / "steps.parquet").to_pylist()
    sums = {True: [0.0, 0.0], False: [0.0, 0.0]}  # prefill in it -> [measured, predicted]
    for s in steps:
        predicted = model.step_seconds(
            s["prefill_tokens"] or 0,
            s["decode_tokens"] or 0,
            int(s["kv_blocks_used"] or 0) * 16 if s["decode_tokens"] else 0,
            s.get("prefill_context_tokens") or 0,
        )
        kind = sums[bool(s["prefill_tokens"])]
        kind[0] += s["step_seconds"]
        kind[1] += predicted
    ratio = [m / p if p else float("nan") for m, p in sums.values()]
    measured, predicted = (sum(v[i] for v in sums.values()) for i in (0, 1))
    return (measured / predicted if predicted else float("nan"), *ratio)


def steps_in(profiles: Path) -> list[dict]:
    """Every step the profiles in this folder hold (the bench's workloads share one)."""
    return [s for f in profiles.glob("*.json") for s in json.loads(f.read_text())["steps"]]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=24, help="rows of the mixed and shared workloads")
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--quickstart-rows", type=int, default=0, help="0: all of it")
    ap.add_argument("--calibrate", type=int, default=8, help="rows sampled by --calibrate")
    ap.add_argument("--only", nargs="*", default=["mixed", "shared", "quickstart"])
    ap.add_argument("--quiet-below", type=float, default=1.0, help="1-minute load average")
    ap.add_argument("--wait", type=float, default=300, help="most seconds to wait for it")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-estimate-"))
    env = {**os.environ, "JOBRUNNER_NO_PROGRESS": "1", "JOBRUNNER_PROFILE_DIR": str(tmp / "p")}
    jobs = {}
    for name, prompts in (("mixed", mixed(args.rows)), ("shared", shared(args.rows))):
        write_rows(tmp / f"{name}.jsonl", prompts)
        jobs[name] = tmp / f"{name}.yaml"
        jobs[name].write_text(
            job_text(name, tmp / f"{name}.jsonl", tmp / f"out-{name}", args.new_tokens, True)
        )
    jobs["quickstart"] = quickstart_job(tmp, args.quickstart_rows or None)
    load = wait_for_quiet(args.quiet_below, args.wait)
    cli("estimate", str(jobs["quickstart"]), "--calibrate", str(args.calibrate), env=env)
    print(
        f"profile calibrated on {args.calibrate} quickstart rows in {tmp / 'p'}"
        f" ({len(steps_in(tmp / 'p'))} engine steps)"
        f" (load average {load:.2f} before, {os.getloadavg()[0]:.2f} after)"
    )
    print(
        f"{'workload':<11} {'rows':>5} {'load':>9} {'wall est':>9} {'wall run':>9} {'error':>7}"
        f" {'cost est':>10} {'cost run':>10} {'error':>7} {'speed':>6} {'at run speed':>12}"
        f" {'prefill':>7} {'decode':>6}"
    )
    for name in args.only:
        load = wait_for_quiet(args.quiet_below, args.wait)
        cli("estimate", str(jobs[name]), env=env)  # uncalibrated: the profile only
        cli("run", str(jobs[name]), env=env)
        loads = f"{load:.1f}-{os.getloadavg()[0]:.1f}"
        out = tmp / f"out-{name}"
        report = json.loads((out / "report.json").read_text())
        est = json.loads((out / "estimate.json").read_text())
        fig = report["estimate"]["figures"]
        w, c = fig["wall_seconds"], fig["cost_usd"]
        k, k_prefill, k_decode = speed(out, est["throughput"])
        at_speed = w["predicted"] + est["forward_seconds"] * (k - 1)
        print(
            f"{name:<11} {fig['rows']['actual']:>5} {loads:>9} {w['predicted']:>8.1f}s"
            f" {w['actual']:>8.1f}s {w['error_fraction']:>+7.1%} {c['predicted']:>10.6f}"
            f" {c['actual']:>10.6f} {c['error_fraction']:>+7.1%} {k:>6.2f}"
            f" {at_speed / w['actual'] - 1:>+12.1%} {k_prefill:>7.2f} {k_decode:>6.2f}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
