"""Start-up: `jobrunner run` from process start to the engine's first step, and its parts; and
the whole-process time of the commands that load no weights (`--help`, `validate`, `estimate`).

The parts are the run directory's own figures, not a clock of the bench's: the run record in
manifest.json (`before_load_seconds`: process start to the model load, i.e. the interpreter, the
CLI, the job file and the input's scan; `load_parts`, which sum to `load_seconds`: imports,
model, engine, warm_up, as engine/start.py names them) and telemetry/steps.parquet (its first
step's start, counted from the engine's start: the first rows prepared). The few milliseconds
between the engine being ready and its loop starting are in no part. A jobrunner older than
`load_parts` gives its load whole, and the time before it from the launch (the bench's clock).

Each run is a fresh process on a small job (the sample prompts' first rows, 4 new tokens), so
the caches a user's second run finds are warm: the GGUF's dequantized copy, the kernel build,
the dtype choice (scripts/bench.py's workload `s` runs this too).

    python scripts/bench_startup.py                  # 3 runs of each
    python scripts/bench_startup.py --repeats 5 --rows 8
    python scripts/bench_startup.py --copies         # and the engine's weight copies
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PARTS = {
    "before_load": "process start to the model load: interpreter, CLI, job file, input scan",
    "imports": "torch, transformers (PreTrainedModel), the engine's modules",
    "model": "the model's own code, dtype choice, weights mapped, tokenizer",
    "engine": "quality gate, engine built (fused weights, KV cache)",
    "warm_up": "two tiny requests: weights packed, kernels loaded",
    "to_first_step": "engine ready to its first step: the first rows prepared",
}
JOB_YAML = """\
name: bench-startup
model: {{source: smollm2-135m-instruct, dtype: {dtype}, max_model_len: 4096}}
input: {{path: {dir}/in.parquet, id_column: id, prompt: {{column: prompt}}}}
generation: {{max_new_tokens: 4, temperature: 0.0}}
output: {{path: {dir}/out, format: jsonl}}
engine: {{kind: paged}}
"""


def startup_parts(run_dir: Path, launched_at: float | None = None) -> dict[str, float]:
    """The last run's start-up, part by part (seconds), from its run directory. A jobrunner
    that did not record its parts (before load_parts) gives its load whole, and the time before
    it from `launched_at` (time.time() at the process's launch) to the load's start (the
    record's end less its wall time)."""
    import pyarrow.parquet as pq

    run = json.loads((run_dir / "manifest.json").read_text())["runs"][-1]
    steps = pq.read_table(run_dir / "telemetry" / "steps.parquet").to_pylist()
    last = max(s["run"] for s in steps)
    first = min((s for s in steps if s["run"] == last), key=lambda s: s["t"])
    to_first = {"to_first_step": first["t"] - first["step_seconds"]}
    if "load_parts" in run:
        return {"before_load": run["before_load_seconds"], **run["load_parts"], **to_first}
    started = run["finished_at"] - run["wall_seconds"]
    before = started - launched_at if launched_at else 0.0
    return {"before_load": before, "load": run["load_seconds"], **to_first}


def show(parts: list[dict[str, float]], what: str) -> None:
    """Each part's median over the runs, and the total: process start to the first step."""
    print(f"  start-up of {what} (median of {len(parts)}; seconds)")
    notes = {"before_load": "", "load": "the load, not split by this jobrunner", **PARTS}
    for name in sorted(parts[0], key=list(notes).index):  # the manifest sorts its keys
        values = [p.get(name, 0.0) for p in parts]
        print(f"    {name:<14} {statistics.median(values):6.2f}   {notes[name]}")
    total = statistics.median(sum(p.values()) for p in parts)
    print(f"    {'total':<14} {total:6.2f}   process start to the first step", flush=True)


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall, CPU) seconds of a whole child process; CPU counts only its own time, so it
    compares on a machine other work loads."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def write_job(tmp: Path, rows: int, dtype: str) -> Path:
    import pyarrow.parquet as pq

    table = pq.read_table(ROOT / "data/samples/prompts.parquet", columns=["id", "prompt"])
    pq.write_table(table.slice(0, rows), tmp / "in.parquet")
    job = tmp / "job.yaml"
    job.write_text(JOB_YAML.format(dir=tmp, dtype=dtype))
    return job


def bench_startup(repeats: int, rows: int, dtype: str, env: dict[str, str]) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="bench-startup-"))
    job = write_job(tmp, rows, dtype)
    jr = [sys.executable, "-m", "jobrunner"]
    print(f"workload s: start-up, {rows} rows, 4 new tokens, {repeats} fresh processes each")
    parts, walls = [], {}
    for _ in range(repeats):
        launched_at = time.time()
        walls.setdefault("run (whole process)", []).append(
            timed([*jr, "run", str(job), "--restart"], env)
        )
        parts.append(startup_parts(tmp / "out", launched_at))
        for name, args in (("--help", ["--help"]), ("validate", ["validate", str(job)])):
            walls.setdefault(name, []).append(timed([*jr, *args], env))
        walls.setdefault("estimate", []).append(timed([*jr, "estimate", str(job)], env))
    show(parts, "`jobrunner run`")
    print("  whole processes (median wall, CPU seconds)")
    for name, got in walls.items():
        wall = statistics.median(w for w, _ in got)
        cpu = statistics.median(c for _, c in got)
        print(f"    {name:<22} {wall:6.2f} s wall  {cpu:6.2f} s CPU", flush=True)


def bench_copies(threads: int) -> None:
    """CPU seconds of the engine's weight copies at start-up, on the built-in model's mapped
    weights: the fused q/k/v and gate/up (model._fuse's torch.cat), every linear packed
    (cpu_kernels.pack_gemm_weight), and the same panels written in one pass (`one_pass_pack`,
    a proposal: no zeroed padded copy, no transposed intermediate)."""
    import torch

    from jobrunner.config import ModelConfig
    from jobrunner.engine.loader import load_model
    from jobrunner.engine.paged import cpu_kernels

    torch.set_num_threads(threads)
    hf = load_model(ModelConfig(dtype="float32")).model
    layers = hf.model.layers
    groups = [[a.q_proj, a.k_proj, a.v_proj] for a in (x.self_attn for x in layers)]
    groups += [[x.mlp.gate_proj, x.mlp.up_proj] for x in layers]
    fused, cpu = _cpu_seconds(lambda: [torch.cat([m.weight for m in g]) for g in groups])
    mib = sum(w.numel() * w.element_size() for w in fused) / 2**20
    print(
        f"  copies: fused q/k/v and gate/up (first touch of the mapped weights) {cpu:.2f} s CPU, {mib:.0f} MiB"
    )
    linears = fused + [x.self_attn.o_proj.weight for x in layers]
    linears += [x.mlp.down_proj.weight for x in layers] + [hf.lm_head.weight]
    ours, cpu = _cpu_seconds(lambda: [one_pass_pack(w) for w in linears])
    print(f"  copies: every linear packed in one pass (proposal) {cpu:.2f} s CPU")
    theirs, cpu = _cpu_seconds(lambda: [cpu_kernels.pack_gemm_weight(w) for w in linears])
    mib = sum(w.numel() * w.element_size() for w in theirs) / 2**20
    same = all(torch.equal(a, b) for a, b in zip(ours, theirs, strict=True))
    print(
        f"  copies: every linear packed (pack_gemm_weight) {cpu:.2f} s CPU, {mib:.0f} MiB; equal: {same}"
    )


def one_pass_pack(w):
    """pack_gemm_weight's (ceil(N/P), K, P) panels, each element written once."""
    from jobrunner.engine.paged import cpu_kernels

    n, k = w.shape
    width = cpu_kernels.load().small_gemm_panel()
    full, panels = n // width, -(-n // width)
    out = w.new_empty(panels, k, width)
    out[:full] = w[: full * width].view(full, width, k).transpose(1, 2)
    if full < panels:
        out[full].zero_()
        out[full, :, : n - full * width] = w[full * width :].T
    return out


def _cpu_seconds(work):
    t = time.process_time()
    out = work()
    return out, time.process_time() - t


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--rows", type=int, default=4)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument(
        "--copies", action="store_true", help="also time the engine's weight copies (in here)"
    )
    args = p.parse_args()
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    bench_startup(args.repeats, args.rows, args.dtype, env)
    if args.copies:
        bench_copies(args.threads)


if __name__ == "__main__":
    main()
