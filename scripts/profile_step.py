"""Where a paged engine step's time goes, on the CPU: prefill of many short rows, prefill of a
few long ones, and decode.

Each workload runs the paged engine on the built-in model over the sample prompts, with the
model's parts wrapped in timers that read the process's CPU time (all threads; on a machine
other processes load, CPU time is what this process spent, where wall time also counts their
turns): the linears (apart from lm_head), lm_head, attention, the norms, SiLU x up, RoPE, and the
rest of the forward pass (embedding, residual adds, slices). Each part prints its seconds, its
share of the forward time and, for the linears, its GFLOP/s against the CPU's peak for the
dtype that runs (scripts/bench_kernels.py). Steps are counted as prefill when they compute
any prompt token, else as decode.

    python scripts/profile_step.py                       # float32, 1 thread, all workloads
    python scripts/profile_step.py --dtype bfloat16 --threads 2 --only short,decode
    python scripts/profile_step.py --dtype bfloat16 --threads 2 --only b --runs 2  # cold, warm
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dtype", default="float32", help="float32 | bfloat16 | auto")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--only", default="short,long,decode", help="short, long, decode, a, b, d")
    p.add_argument("--rows", type=int, default=64, help="rows of the short prefill workload")
    p.add_argument("--max-batch-tokens", type=int, default=None, help="default: the job's")
    p.add_argument("--kv-cache-dtype", default="auto", help="auto | bfloat16 | int8 | fp8 ...")
    p.add_argument(
        "--block-size", type=int, default=None, help="KV cache block; default: the job's"
    )
    p.add_argument(
        "--runs",
        type=int,
        default=1,
        help="runs of each workload on one engine: the first maps the cache's and the heap's "
        "pages at their first writes, later ones reuse them",
    )
    return p.parse_args()


args = parse_args()
os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))

import torch  # noqa: E402
from bench import chat_ids, job_texts, mixed_prompts, prefill_flops  # noqa: E402
from bench_kernels import peak_flops  # noqa: E402
from bench_runs import requests  # noqa: E402

from jobrunner.collector import settled  # noqa: E402
from jobrunner.config import JobConfig, ModelConfig  # noqa: E402
from jobrunner.engine import heap  # noqa: E402
from jobrunner.engine.engines import ENGINES  # noqa: E402
from jobrunner.engine.loader import load_model  # noqa: E402
from jobrunner.engine.paged import cpu_kernels  # noqa: E402
from jobrunner.engine.paged import model as paged_model  # noqa: E402
from jobrunner.prep.order import order_requests  # noqa: E402


class Parts:
    """CPU seconds (and linear FLOPs) by part, kept apart for prefill and decode steps."""

    def __init__(self) -> None:
        self.seconds = {"prefill": defaultdict(float), "decode": defaultdict(float)}
        self.flops = {"prefill": defaultdict(float), "decode": defaultdict(float)}
        self.steps = {"prefill": 0, "decode": 0}
        self.tokens = {"prefill": 0, "decode": 0}  # the steps' rows of input
        self.kind = "decode"

    def timed(self, part: str, fn, within: str | None = None):
        """fn timed as `part`; one `within` another part is a share of that part's time,
        printed under it and not counted twice."""

        def wrapper(*a, **kw):
            t0 = time.process_time()
            out = fn(*a, **kw)
            key = f"{within}/{part}" if within else part
            self.seconds[self.kind][key] += time.process_time() - t0
            return out

        return wrapper


def instrument(eng, parts: Parts) -> None:
    """Times this engine's linears and forward passes into `parts`; the module-level parts
    (attention, SiLU, RoPE) are wrapped once, in `main`, and read `PARTS`."""
    m = eng.model
    if not hasattr(m, "untimed"):  # a later run wraps the model's own parts again, not ours
        m.untimed = (m.small_rows, m._norm, m.forward)
    small_rows, norm, forward = m.untimed
    vocab = m.hf.config.vocab_size

    def timed_linear(fn, x_at: int = 0, declines: bool = False):
        """fn(..., x, weight, bias) timed as lm_head or the linears, its FLOPs counted unless it
        `declines` the step by returning None (silu_gated, off the AMX tiles)."""

        def wrapper(*a):
            t0 = time.process_time()
            out = fn(*a)
            x, weight = a[x_at], a[x_at + 1]
            part = "lm_head" if weight.shape[0] == vocab else "linears"
            parts.seconds[parts.kind][part] += time.process_time() - t0
            if not (declines and out is None):
                parts.flops[parts.kind][part] += (
                    2.0 * x.shape[0] * weight.shape[0] * weight.shape[1]
                )
            return out

        return wrapper

    linear = timed_linear(small_rows)
    if hasattr(small_rows, "silu_gated"):  # gate/up with SiLU x up inside: counted as linears
        linear.silu_gated = timed_linear(small_rows.silu_gated, declines=True)
        linear.rounded = timed_linear(small_rows.rounded)  # rows rounded where they were made
        linear.add_ = timed_linear(small_rows.add_, x_at=1)  # y += the linear, in the kernel

    def step(input_ids, positions, meta, kv_caches, logits_rows):
        parts.kind = "decode" if input_ids.shape[0] == logits_rows.shape[0] else "prefill"
        parts.steps[parts.kind] += 1
        parts.tokens[parts.kind] += input_ids.shape[0]
        return parts.timed("forward", forward)(input_ids, positions, meta, kv_caches, logits_rows)

    m.small_rows, m._norm, m.forward = linear, parts.timed("norms", norm), step
    PARTS[0] = parts


PARTS: list[Parts] = [Parts()]  # the workload being timed


def wrap_modules() -> None:
    def timed(part: str, fn, within: str | None = None):
        return lambda *a, **kw: PARTS[0].timed(part, fn, within)(*a, **kw)

    paged_model.paged_attention = timed("attention", paged_model.paged_attention)
    cpu_kernels.paged_prefill = timed("prompt chunks", cpu_kernels.paged_prefill, "attention")
    cpu_kernels.paged_decode = timed("decode rows", cpu_kernels.paged_decode, "attention")
    cpu_kernels.silu_mul = timed("silu x up", cpu_kernels.silu_mul)
    cpu_kernels.rope_ = timed("rope", cpu_kernels.rope_)
    cpu_kernels.rope_kv_write_ = timed("rope+kv", cpu_kernels.rope_kv_write_)


def workloads(tokenizer) -> dict[str, tuple[list[list[int]], int, bool]]:
    """name: (prompts, new tokens a row, whether EOS is ignored)."""
    short = mixed_prompts(tokenizer, args.rows, 256)
    long = [p for p in mixed_prompts(tokenizer, 64, 2700) if len(p) >= 1500][:4]
    decode = mixed_prompts(tokenizer, 32, 600)
    bench_b = mixed_prompts(tokenizer, 64, 2700)  # bench.py (b): 64 rows, 64 new tokens
    bench_d = [chat_ids(tokenizer, t) for t in job_texts(tokenizer, 512, 1024)]  # (d), EOS kept
    return {
        "short": (short, 1, True),
        "long": (long, 1, True),
        "decode": (decode, 32, True),
        "a": (bench_b, 256, False),  # bench.py (a): the same rows, 256 new tokens, EOS kept
        "b": (bench_b, 64, True),
        "d": (bench_d, 64, False),
    }


def report(name: str, parts: Parts, peak: float, flops_prefill: float | None) -> None:
    for kind in ("prefill", "decode"):
        sec, fl = parts.seconds[kind], parts.flops[kind]
        total = sec.pop("forward", 0.0)
        if not parts.steps[kind] or total <= 0:
            continue
        shares = {k: sec.pop(k) for k in [k for k in sec if "/" in k]}
        rest = total - sum(sec.values())
        line = f"{name} {kind}: {parts.steps[kind]} steps of {parts.tokens[kind]} tokens"
        line += f", {total:.2f} s of CPU"
        if kind == "prefill" and flops_prefill:
            rate = flops_prefill / total * args.threads
            line += f", {rate / 1e9:.1f} GFLOP/s = {rate / peak:.0%} of peak"
        print(line)
        for part, s in sorted(sec.items(), key=lambda kv: -kv[1]) + [("the rest", rest)]:
            note = ""
            if fl.get(part):
                rate = fl[part] / s * args.threads
                note = f"  {rate / 1e9:.1f} GFLOP/s = {rate / peak:.0%} of peak"
            print(f"  {part:<10} {s:7.2f} s {s / total:6.1%}{note}")
            for key, t in shares.items():
                if key.startswith(part + "/"):
                    print(f"    {key.split('/')[1]:<14} {t:7.2f} s")


def main() -> None:
    torch.set_num_threads(args.threads)
    loaded = load_model(ModelConfig(dtype=args.dtype))
    kept = heap.keep_freed_memory()  # as make_engine does on CPU (JOBRUNNER_KEEP_HEAP=0: not)
    dtype = loaded.model.dtype
    mixed = dtype == torch.bfloat16 and cpu_kernels.gemm_bf16_supported()
    peak, how = peak_flops(args.threads, bf16=mixed)
    print(f"dtype {str(dtype).removeprefix('torch.')}, kernels {cpu_kernels.isa()}; peak {how}")
    print(f"heap: freed memory {'kept' if kept else 'returned (fresh pages each step)'}")
    cfg = JobConfig()
    cfg.model.max_model_len = 4096
    cfg.engine.prefix_caching = False  # every prompt token computed, as counted
    cfg.model.kv_cache_dtype = args.kv_cache_dtype
    if args.max_batch_tokens:
        cfg.engine.max_batch_tokens = args.max_batch_tokens
    if args.block_size:
        cfg.engine.block_size = args.block_size
    wrap_modules()
    for name, (prompts, new, ignore_eos) in workloads(loaded.tokenizer).items():
        if name not in args.only.split(","):
            continue
        eng = ENGINES.get("paged")(loaded, cfg)
        eng.warm_up()  # weights packed, first kernel calls: a job's load, not its steps
        for run in range(args.runs):
            parts = Parts()
            instrument(eng, parts)
            reqs = requests(prompts, new, ignore_eos)
            with settled():  # the collector as a run's pipeline sets it
                t0, sys0 = time.perf_counter(), os.times().system
                done = list(eng.generate(order_requests(reqs, 4096)))
            tokens = sum(map(len, prompts))
            made = sum(r.usage.completion_tokens for r in done)
            label = f"{name} (run {run + 1})" if args.runs > 1 else name
            print(
                f"\n{label}: {len(prompts)} rows, {tokens} prompt tokens, {made} generated (at most"
                f" {new} a row),"
            )
            print(
                f"  {time.perf_counter() - t0:.2f} s wall, "
                f"{os.times().system - sys0:.2f} s of it system time (all threads)"
            )
            report(name, parts, peak, prefill_flops(loaded.model.config, prompts))


if __name__ == "__main__":
    main()
