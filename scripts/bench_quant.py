"""Quantization benchmark: tokens/s, weight memory and agreement, per format, in one process.

CPU section (the built-in SmolLM2-135M, the job's dtype `auto`): none / int8 / int4 weights,
and a float16 / int8 / fp8 KV cache, through the paged engine on the sample questions. Agreement is
measured against the unquantized run: `agree` is the share of its greedy tokens the quantized
model also ranks first (teacher-forced), `exact` the share of the first K generated tokens that
are equal position by position (free-running), `kv blocks` the blocks a fixed 64 MiB KV budget
holds. GPU section (only with CUDA): bf16 / fp8 / int8 on a larger random-weight Llama shape,
where agreement only tells that the numerics stay close (random weights make flat logits).

    python scripts/bench_quant.py                 # ~3 minutes on 2 cores
    python scripts/bench_quant.py --rows 32 --new 32
"""

from __future__ import annotations

import argparse
import copy
import time
from pathlib import Path

import torch

from jobrunner.config import JobConfig, ModelConfig
from jobrunner.engine.engines import make_engine
from jobrunner.engine.loader import LoadedModel, load_model
from jobrunner.engine.quant import apply_quantization, weight_bytes
from jobrunner.engine.quant.quality import exact_prefix, nll_and_top1
from jobrunner.types import Request, SamplingParams

ROOT = Path(__file__).resolve().parent.parent
KV_BUDGET = 64 << 20
CPU_MODES = [
    ("none", "auto"),
    ("int8", "auto"),
    ("int4", "auto"),
    ("none", "float16"),
    ("none", "int8"),
    ("none", "fp8"),
    ("int8", "int8"),
]
GPU_MODES = [("none", "auto"), ("fp8", "auto"), ("int8", "auto"), ("fp8", "fp8")]


def questions(n: int) -> list[str]:
    import pyarrow.parquet as pq

    t = pq.read_table(ROOT / "data/samples/prompts.parquet", columns=["kind", "prompt"]).to_pylist()
    return [r["prompt"] for r in t if r["kind"] == "question"][:n]


def requests(tok, texts: list[str], new: int) -> list[Request]:
    out = []
    for i, text in enumerate(texts):
        ids = tok.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
        )
        ids = list(ids if isinstance(ids, list) else ids["input_ids"])
        out.append(Request(f"r{i}", ids, SamplingParams(max_new_tokens=new, ignore_eos=True)))
    return out


def run(loaded: LoadedModel, quant: str, kv: str, reqs: list[Request]) -> dict:
    cfg = JobConfig()
    cfg.model.quantization, cfg.model.kv_cache_dtype = quant, kv
    cfg.engine.kv_cache_bytes = KV_BUDGET
    apply_quantization(loaded, cfg.model)
    engine = make_engine(loaded, cfg)
    t = time.perf_counter()
    out = {r.id: list(r.token_ids) for r in engine.generate(iter(reqs))}
    seconds = time.perf_counter() - t
    st = engine.stats
    return {
        "tokens": [out[r.id] for r in reqs],
        "tok_s": st.decode_tokens / seconds,
        "weight_bytes": weight_bytes(loaded.model),
        "kv_blocks": st.num_kv_blocks,
        "kv_bytes_per_token": st.kv_bytes_per_token,
    }


def table(base: LoadedModel, modes, reqs: list[Request], new: int) -> None:
    prompts = [r.prompt_token_ids for r in reqs]
    ref = None
    print(
        f"| weights | KV cache | tokens/s | weight bytes | vs 16-bit | KV bytes/token | kv blocks"
        f" ({KV_BUDGET >> 20} MiB) | agree | exact (first {new}) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for quant, kv in modes:
        loaded = copy.copy(base)
        loaded.model = copy.deepcopy(base.model)
        r = run(loaded, quant, kv, reqs)
        if ref is None:
            ref = r
        _, top1 = nll_and_top1(loaded.model, prompts, ref["tokens"])
        target = torch.tensor([t for x in ref["tokens"] for t in x])
        agree = float((top1 == target).float().mean())
        print(
            f"| {quant} | {kv} | {r['tok_s']:.1f} | {r['weight_bytes']:,} |"
            f" {r['weight_bytes'] / ref['weight_bytes']:.0%} | {r['kv_bytes_per_token']:,} |"
            f" {r['kv_blocks']:,} | {agree:.1%} | {exact_prefix(ref['tokens'], r['tokens'], new):.1%} |",
            flush=True,
        )
        del loaded


def random_llama(tok, device) -> LoadedModel:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=8,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=len(tok),
        max_position_embeddings=4096,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    base = load_model.__globals__["resolve_source"]("smollm2-135m-instruct")
    return LoadedModel(model, tok, base, torch.device(device), torch.bfloat16, "")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--new", type=int, default=24)
    ap.add_argument("--threads", type=int, default=None)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    base = load_model(ModelConfig(device="cpu"))
    reqs = requests(base.tokenizer, questions(a.rows), a.new)
    print(
        f"## CPU: {base.source.name}, {str(base.dtype).removeprefix('torch.')}, {a.rows} rows x"
        f" {a.new} new tokens, {torch.get_num_threads()} threads\n"
    )
    table(base, CPU_MODES, reqs, a.new)
    if torch.cuda.is_available():
        name = torch.cuda.get_device_name()
        print(
            f"\n## GPU: {name}, random-weight Llama shape (4096 hidden, 8 layers, GQA 32/8),"
            f" {a.rows * 8} rows x {a.new} new tokens\n"
        )
        gpu = random_llama(base.tokenizer, "cuda")
        table(gpu, GPU_MODES, requests(base.tokenizer, questions(a.rows) * 8, a.new), a.new)


if __name__ == "__main__":
    main()
