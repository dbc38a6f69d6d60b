"""Structured-output bench: JSON-schema extraction against free text on the same rows.

The rows are the mixed-length sample prompts (data/samples/prompts.parquet, repeated with a
second instruction past its 240 rows), each asking for its topic, kind, difficulty, a score and
up to three keywords. One engine runs them unconstrained and under a five-field JSON schema,
alternating (free, json, json, free by default) so that a drifting machine load weighs on both
the same; tokens/s is generated tokens over each run's wall time. Printed: the table, each
distinct schema's compile time, and the sampler's bitmask time per step (fill + apply).

    python scripts/bench_structured.py                 # 256 rows, 64 new tokens
    python scripts/bench_structured.py --rows 64 --rounds 1
    python scripts/bench_structured.py --engine static  # HF generate, as for GPT-2 or Gemma
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import pyarrow.parquet as pq

from jobrunner.config import JobConfig
from jobrunner.engine.base import Engine
from jobrunner.engine.loader import load_model
from jobrunner.engine.paged import PagedEngine
from jobrunner.engine.static import StaticEngine
from jobrunner.structured.spec import response_format_spec
from jobrunner.types import Request, SamplingParams

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = {
    "type": "object",
    "properties": {
        "topic": {"type": "string", "maxLength": 40},
        "kind": {"enum": ["question", "summary", "explanation"]},
        "difficulty": {"enum": ["easy", "medium", "hard"]},
        "score": {"type": "integer", "minimum": 1, "maximum": 5},
        "keywords": {"type": "array", "items": {"type": "string", "maxLength": 16}, "maxItems": 3},
    },
    "required": ["topic", "kind", "difficulty", "score", "keywords"],
}
ASK = (
    "Extract, as JSON with topic, kind, difficulty, score (1-5) and keywords, from this request:",
    "Read this request and give its topic, kind, difficulty, a score and keywords as JSON:",
)


def chat_ids(tokenizer, text: str) -> list[int]:
    templated = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
    )
    return tokenizer(templated, add_special_tokens=False)["input_ids"]


def requests(tokenizer, rows: int, max_new: int, spec) -> list[Request]:
    texts = pq.read_table(ROOT / "data/samples/prompts.parquet")["prompt"].to_pylist()
    out = []
    for i in range(rows):
        text = f"{ASK[(i // len(texts)) % 2]}\n\n{texts[i % len(texts)]}"
        ids = chat_ids(tokenizer, text)
        out.append(Request(f"r{i}", list(ids), SamplingParams(max_new, structured=spec)))
    return out


def run(engine: Engine, reqs: list[Request]) -> dict:
    before = engine.stats.generated_tokens
    t = time.perf_counter()
    results = list(engine.generate(reqs))
    wall = time.perf_counter() - t
    tokens = engine.stats.generated_tokens - before
    valid = sum(1 for r in results if r.structure == "complete")
    return {"wall": wall, "tokens": tokens, "tok_s": tokens / wall, "complete": valid}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2, help="free/json pairs, order alternating")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--engine", choices=("paged", "static"), default="paged")
    args = ap.parse_args()
    # no prefix cache: each run computes its prompts, whichever ran before it
    cfg = JobConfig.model_validate(
        {"model": {"dtype": args.dtype}, "engine": {"prefix_caching": False}}
    )
    loaded = load_model(cfg.model)
    engine = (PagedEngine if args.engine == "paged" else StaticEngine)(loaded, cfg)
    spec = response_format_spec(
        {"type": "json_schema", "json_schema": {"name": "extract", "schema": SCHEMA}}, "bench"
    )
    free = requests(loaded.tokenizer, args.rows, args.max_new_tokens, None)
    constrained = requests(loaded.tokenizer, args.rows, args.max_new_tokens, spec)
    run(engine, free[:8])  # warm-up: kernels, allocator
    order = [("free", free), ("json", constrained)]
    measured: dict[str, list[dict]] = {"free": [], "json": []}
    for k in range(args.rounds):
        for name, reqs in order if k % 2 == 0 else order[::-1]:
            measured[name].append(run(engine, reqs))
            print(f"round {k + 1} {name}: {measured[name][-1]}", flush=True)
    g = engine.grammars
    free_tps = sum(m["tokens"] for m in measured["free"]) / sum(m["wall"] for m in measured["free"])
    json_tps = sum(m["tokens"] for m in measured["json"]) / sum(m["wall"] for m in measured["json"])
    print(
        f"\n{args.engine} engine, {args.rows} rows, max_new_tokens {args.max_new_tokens}, {args.rounds} round(s)"
    )
    print("| run | generated tokens | wall s | tokens/s | complete JSON |")
    print("| --- | --- | --- | --- | --- |")
    for name in ("free", "json"):
        ms = measured[name]
        toks, wall = sum(m["tokens"] for m in ms), sum(m["wall"] for m in ms)
        done = f"{sum(m['complete'] for m in ms)}/{args.rows * len(ms)}" if name == "json" else "-"
        print(f"| {name} | {toks} | {wall:.1f} | {toks / wall:.1f} | {done} |")
    print(f"\njson / free tokens/s: {json_tps / free_tps:.3f}")
    print(f"tokenizer vocabulary scan (once per process): {g.tokenizer_seconds * 1000:.0f} ms")
    for st in g.stats.values():
        print(f"compile {st.label}: {st.seconds * 1000:.1f} ms, {st.rows} rows")
    per_step = g.mask_seconds / max(1, g.mask_steps)
    per_row = g.mask_seconds / max(1, g.mask_rows)
    print(
        f"bitmask (fill + apply): {per_step * 1000:.3f} ms per step over {g.mask_steps} steps,"
        f" {per_row * 1e6:.1f} us per constrained row-step"
    )
    print(json.dumps({"free_tok_s": free_tps, "json_tok_s": json_tps}))


if __name__ == "__main__":
    main()
