"""The batch job as a user writes it with HF transformers alone: the baseline of bench.py (d).

Reads a Parquet `prompt` column, applies the chat template, sorts by length, generates greedily
in left-padded batches and writes one JSON line per row (id, completion, completion_tokens).

    python scripts/hf_job.py --model DIR --input in.parquet --output out.jsonl
"""

from __future__ import annotations

import argparse
import json

import pyarrow.parquet as pq
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True, help="an HF model directory")
    p.add_argument("--input", required=True)
    p.add_argument("--output", required=True)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--dtype", default="float32")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=getattr(torch, args.dtype))
    model.eval()
    table = pq.read_table(args.input, columns=["id", "prompt"]).to_pylist()
    ids = [
        tok.apply_chat_template(
            [{"role": "user", "content": r["prompt"]}], add_generation_prompt=True, tokenize=True
        )
        for r in table
    ]
    ids = [list(x if isinstance(x, list) else x["input_ids"]) for x in ids]
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    with open(args.output, "w") as out, torch.inference_mode():
        for start in range(0, len(order), args.batch_size):
            rows = order[start : start + args.batch_size]
            width = max(len(ids[i]) for i in rows)
            x = torch.tensor([[pad] * (width - len(ids[i])) + ids[i] for i in rows])
            mask = torch.tensor([[0] * (width - len(ids[i])) + [1] * len(ids[i]) for i in rows])
            gen = model.generate(
                input_ids=x,
                attention_mask=mask,
                max_new_tokens=args.max_new_tokens,
                do_sample=False,
                pad_token_id=pad,
            )[:, width:]
            for i, row in zip(rows, gen.tolist(), strict=True):
                kept = _until_eos(row, model.generation_config.eos_token_id, pad)
                text = tok.decode(kept, skip_special_tokens=True)
                line = {"id": table[i]["id"], "completion": text, "completion_tokens": len(kept)}
                out.write(json.dumps(line) + "\n")


def _until_eos(row: list[int], eos, pad: int) -> list[int]:
    stops = set(eos if isinstance(eos, list) else [eos]) | {pad}
    for n, t in enumerate(row):
        if t in stops:
            return row[: n + 1]
    return row


if __name__ == "__main__":
    main()
