"""Build data/samples/openai_batch.jsonl: an OpenAI Batch API input file over the sample prompts.

Twenty lines from data/samples/prompts.jsonl, alternating /v1/chat/completions (the row's chat
messages) and /v1/completions (the question as raw text), with per-line max_tokens, stop strings,
temperature and seed, as a team's existing batch file would have them.

    python scripts/make_openai_batch_sample.py [--rows 20]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

SAMPLES = Path(__file__).resolve().parents[1] / "data" / "samples"


def batch_line(k: int, row: dict) -> dict:
    if k % 2 == 0:
        body = {
            "model": "gpt-4o-mini",
            "messages": row["messages"],
            "max_tokens": 48 + 16 * (k % 3),
        }
        if k % 4 == 0:
            body["messages"] = [{"role": "system", "content": "Answer briefly."}, *row["messages"]]
        url = "/v1/chat/completions"
    else:
        prompt = f"Question: {row['prompt'][:600]}\nAnswer: The"
        body = {"model": "gpt-4o-mini", "prompt": prompt, "max_tokens": 40, "stop": ["\n\n"]}
        url = "/v1/completions"
    if k % 5 == 3:
        body.update(temperature=0.7, top_p=0.9, seed=1000 + k)
    return {"custom_id": f"request-{k + 1}", "method": "POST", "url": url, "body": body}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=20)
    args = ap.parse_args()
    with open(SAMPLES / "prompts.jsonl", encoding="utf-8") as f:
        rows = [json.loads(line) for _, line in zip(range(args.rows), f, strict=False)]
    out = SAMPLES / "openai_batch.jsonl"
    with open(out, "w", encoding="utf-8") as f:
        for k, row in enumerate(rows):
            f.write(json.dumps(batch_line(k, row), ensure_ascii=False) + "\n")
    print(f"wrote {len(rows)} lines to {out}")


if __name__ == "__main__":
    main()
