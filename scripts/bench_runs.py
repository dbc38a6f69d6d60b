"""One measurement of scripts/bench.py: HF `generate` or one of our engines on given prompts.

By default each measurement runs in a fresh Python process (this file, given a JSON work file),
as a user would run each tool, so that no run inherits the state another left behind: the
paged engine fuses the shared HF model's q/k/v and gate/up weights in place, and glibc's
malloc keeps the thresholds earlier runs raised (see MALLOC_ENV). `bench.py --same-process`
runs them all in one.

    python scripts/bench_runs.py WORK.json    # prints one JSON line: tokens, seconds, ...
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch

from jobrunner.collector import settled
from jobrunner.config import JobConfig, ModelConfig
from jobrunner.engine.loader import load_model
from jobrunner.prep.order import order_requests
from jobrunner.types import Request, SamplingParams

ROOT = Path(__file__).resolve().parent.parent

# glibc's malloc hands a freed block above its mmap threshold back to the kernel, so a fresh
# multi-MB tensor every step, as HF generate's growing cache allocates (torch.cat per layer),
# is page-faulted in anew each time. A fixed 32 MiB threshold (glibc's largest) and no trimming
# keep such blocks in the heap: HF static (a) ran at 42 tok/s without them and 55 with them,
# about what it reached in one shared process after (b) had raised the threshold. Every child
# process of the bench gets them (baselines at their best); --default-malloc leaves them out.
MALLOC_ENV = {
    "MALLOC_MMAP_THRESHOLD_": str(32 << 20),
    "MALLOC_TRIM_THRESHOLD_": str(1 << 40),
    "MALLOC_TOP_PAD_": str(512 << 20),
}


# what a measurement of our engines reports of their EngineStats
ENGINE_STATS = (
    "busy_fraction",
    "preemptions",
    "prefill_tokens",
    "draft_tokens",
    "accepted_draft_tokens",
)


def child_env(args) -> dict[str, str]:
    """The environment of every process the bench starts: its threads, and MALLOC_ENV."""
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    return env if args.default_malloc else {**env, **MALLOC_ENV}


def requests(prompts, max_new: int, ignore_eos: bool) -> list[Request]:
    params = SamplingParams(max_new_tokens=max_new, ignore_eos=ignore_eos)
    return [Request(str(i), p, params) for i, p in enumerate(prompts)]


def hf_generate(
    loaded, prompts, max_new: int, ignore_eos: bool, batch_size: int
) -> tuple[int, float]:
    """Left-padded, length-sorted static batches through HF generate; (tokens, seconds)."""
    model, tok = loaded.model, loaded.tokenizer
    eos = sorted(loaded.eos_token_ids)
    pad = tok.pad_token_id if tok.pad_token_id is not None else eos[0]
    order = sorted(prompts, key=len)
    tokens, t0 = 0, time.perf_counter()
    for i in range(0, len(order), batch_size):
        chunk = order[i : i + batch_size]
        width = max(map(len, chunk))
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in chunk], device=model.device)
        mask = torch.tensor(
            [[0] * (width - len(p)) + [1] * len(p) for p in chunk], device=ids.device
        )
        kw = (
            {"eos_token_id": None, "min_new_tokens": max_new}
            if ignore_eos
            else {"eos_token_id": eos}
        )
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=max_new,
            do_sample=False,
            pad_token_id=pad,
            **kw,
        )[:, width:]
        tokens += sum(_count(row, eos, ignore_eos) for row in out.tolist())
    return tokens, time.perf_counter() - t0


def _count(row: list[int], eos: list[int], ignore_eos: bool) -> int:
    if ignore_eos:
        return len(row)
    for i, t in enumerate(row):
        if t in eos:
            return i + 1
    return len(row)


def run_engine(
    kind: str, loaded, reqs, kv_cache_dtype: str = "auto", inspect=None, warm=False, **engine
) -> tuple[int, float, object, list, float]:
    """(generated tokens, seconds, engine stats, each row's token ids in request order, the
    process's CPU seconds over the same span), after the engine's warm-up. `inspect(engine)`,
    if given, runs after the rows, before the engine is dropped. `warm`: the rows run twice on
    one engine, the prefix cache emptied between them, and the second run is the one measured:
    the same work, on cache and heap pages the first mapped, as a vLLM engine's are by its
    start-up (a zero-filled cache, a profiling step)."""
    from dataclasses import replace

    from jobrunner.engine.engines import ENGINES

    cfg = JobConfig()
    cfg.model.max_model_len = 4096  # the longest prompts (2,700 tokens) plus 256 new ones
    cfg.model.kv_cache_dtype = kv_cache_dtype
    for k, v in engine.items():
        setattr(cfg.engine, k, v)
    eng = ENGINES.get(kind)(loaded, cfg)
    # as a job's load does (engine/start.py) and as bench_vllm.py warms vLLM up before timing:
    # weights packed for the kernels and the kernels' first calls, not counted as the rows'
    eng.warm_up()
    if warm:
        for _ in eng.generate(order_requests([replace(r) for r in reqs], 4096)):
            pass
        eng.reset_prefix_cache()  # the same work again: no prompt head is cached
        eng.reset_stats()  # the stats returned are the measured run's
    with settled():  # the collector as a run's pipeline sets it while rows stream
        t0, cpu0 = time.perf_counter(), time.process_time()
        results = {r.id: r for r in eng.generate(order_requests(reqs, 4096))}
        seconds = time.perf_counter() - t0
        cpu_seconds = time.process_time() - cpu0
    failed = [f"{r.id}: {r.error}" for r in results.values() if r.error_code]
    if failed:
        raise SystemExit(f"{kind}: {len(failed)} rows failed, e.g. {failed[0]}")
    tokens = sum(r.usage.completion_tokens for r in results.values())
    if inspect is not None:
        inspect(eng)
    stats = eng.stats
    del eng
    release(loaded.device)
    return tokens, seconds, stats, [results[r.id].token_ids for r in reqs], cpu_seconds


def release(device) -> None:
    """Hand a dropped engine's KV cache back before the next run: a CUDA engine sizes its cache
    from the device's free memory, which torch's cache of freed blocks would otherwise keep."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def measure(loaded, work: dict) -> dict:
    """The run `work` names, here: tokens and seconds, and for our engines their stats and each
    row's token ids."""
    prompts, max_new, ignore_eos = work["prompts"], work["max_new"], work["ignore_eos"]
    if work["run"] == "hf":
        tokens, seconds = hf_generate(loaded, prompts, max_new, ignore_eos, work["batch_size"])
        return {"tokens": tokens, "seconds": seconds}
    reqs = requests(prompts, max_new, ignore_eos)
    tokens, seconds, st, ids, cpu_seconds = run_engine(
        work["run"],
        loaded,
        reqs,
        work.get("kv", "auto"),
        warm=work.get("warm", False),
        **work.get("engine", {}),
    )
    stats = {k: getattr(st, k) for k in ENGINE_STATS}
    stats["cpu_seconds"] = cpu_seconds  # all threads' CPU time, which other processes inflate less
    return {"tokens": tokens, "seconds": seconds, "token_ids": ids, **stats}


def run_json(cmd: list[str], work: dict, what: str, **kw) -> tuple[dict, float]:
    """`cmd WORK.json` as a child process; the last JSON line it printed, and its seconds."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(work, f)
    t0 = time.perf_counter()
    done = subprocess.run([*cmd, f.name], capture_output=True, text=True, **kw)
    seconds = time.perf_counter() - t0
    os.unlink(f.name)
    if done.returncode != 0:
        raise SystemExit(f"{what} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    line = [x for x in done.stdout.splitlines() if x.startswith('{"tokens"')][-1]  # tools log too
    return json.loads(line), seconds


def run_vllm(loaded, args, work: dict) -> dict:
    """scripts/bench_vllm.py in vLLM's venv on `work`; its JSON line plus process seconds."""
    work = {"model": loaded.weights_dir, "warmup_token": 30, "max_model_len": 4096, **work}
    cmd = [args.vllm_python, str(ROOT / "scripts/bench_vllm.py")]
    cmd += ["--threads", str(args.threads), "--dtype", args.vllm_dtype]
    got, seconds = run_json(cmd, work, "vLLM", cwd=tempfile.gettempdir(), env=child_env(args))
    return {**got, "process_seconds": seconds}


class Runs:
    """Measurements for bench.py, each in a fresh process unless args.same_process."""

    def __init__(self, loaded, args):
        self.loaded, self.args = loaded, args

    def hf(self, prompts, max_new: int, ignore_eos: bool, batch_size: int) -> SimpleNamespace:
        return self._run({"run": "hf", "batch_size": batch_size}, prompts, max_new, ignore_eos)

    def engine(
        self,
        kind: str,
        prompts,
        max_new: int,
        ignore_eos: bool,
        kv: str = "auto",
        warm: bool = False,
        **engine,
    ) -> SimpleNamespace:
        work = {"run": kind, "kv": kv, "warm": warm, "engine": engine}
        return self._run(work, prompts, max_new, ignore_eos)

    def _run(self, work: dict, prompts, max_new: int, ignore_eos: bool) -> SimpleNamespace:
        """`measure(work)` here or in a child process: its fields as attributes."""
        work = {**work, "prompts": prompts, "max_new": max_new, "ignore_eos": ignore_eos}
        if self.args.same_process:
            return SimpleNamespace(**measure(self.loaded, work))
        work |= {"dtype": self.args.dtype, "threads": self.args.threads}
        cmd = [sys.executable, str(Path(__file__).resolve())]
        got = run_json(cmd, work, f"{work['run']} run", env=child_env(self.args))[0]
        return SimpleNamespace(**got)


def main() -> None:
    work = json.loads(Path(sys.argv[1]).read_text())
    torch.set_num_threads(work["threads"])
    loaded = load_model(ModelConfig(dtype=work["dtype"]))
    print(json.dumps(measure(loaded, work)), flush=True)


if __name__ == "__main__":
    main()
