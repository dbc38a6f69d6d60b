"""Preparation speed (read, render, tokenize) and its cost to the engine, in one process.

    python scripts/bench_prep.py --corpus /work/scale/corpus-1000000.parquet --rows 50000

1. rows/s of Preparer.prepare over the corpus (wall and CPU time), alternated in the same
   process: the chat template rendered per row through Jinja, the whole text through the fast
   tokenizer's batch call; the frame rendered once (prep/render.py), the user text through the
   batch call; the frame, the user text by cached byte-level BPE pieces (prep/tokens.py);
2. the paged engine's mean step time decoding a fixed batch, alone and with the preparation
   stage running in its thread as it does during a run.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import threading
import time

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # what the CLI sets
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def prep_rate(cfg, tok, rows: int, variant: str) -> tuple[float, float]:
    """(rows/s of wall time, rows/s of this process's CPU time) of Preparer.prepare."""
    from jobrunner.formats import make_preparer, read_rows
    from jobrunner.prep.tokens import TextEncoder

    prep = make_preparer(cfg, tok)
    if variant == "jinja_per_row":
        prep.renderer.__dict__["_frame"] = None  # cached_property: force the per-row path
        prep.renderer.__dict__["frame_token_ids"] = None
    if variant != "framed_cached_bpe":  # the fast tokenizer's batch call for every text
        batch_call = TextEncoder(tok)
        batch_call._model = None
        prep.__dict__["encoder"] = batch_call
    t, c = time.perf_counter(), time.process_time()
    n = sum(1 for _ in prep.prepare(itertools.islice(read_rows(cfg.input.path), rows)))
    return n / (time.perf_counter() - t), n / (time.process_time() - c)


def step_time(loaded, cfg, tok, with_prep: bool) -> float:
    from jobrunner.engine.engines import make_engine
    from jobrunner.formats import make_preparer, read_rows

    prep = make_preparer(cfg, tok)
    reqs = list(itertools.islice(prep.prepare(read_rows(cfg.input.path)), 16))
    engine = make_engine(loaded, cfg)
    stop = threading.Event()

    def background() -> None:
        p = make_preparer(cfg, tok)
        for _ in p.prepare(read_rows(cfg.input.path)):
            if stop.is_set():
                return

    thread = threading.Thread(target=background, daemon=True)
    if with_prep:
        thread.start()
    for _ in engine.generate(iter(reqs)):
        pass
    stop.set()
    st = engine.stats
    return st.engine_seconds / max(st.steps, 1)


def main() -> None:
    from jobrunner.config import JobConfig
    from jobrunner.engine.loader import load_model

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--rows", type=int, default=50_000)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    cfg = JobConfig.model_validate(
        {
            "input": {"path": args.corpus},
            "generation": {"max_new_tokens": 64, "ignore_eos": True},
            "engine": {"max_num_seqs": 16, "kv_cache_bytes": 64 << 20},
        }
    )
    loaded = load_model(cfg.model)
    tok = loaded.tokenizer
    out: dict = {"rows": args.rows, "cpu_count": os.cpu_count()}
    variants = ["jinja_per_row", "framed_batch_call", "framed_cached_bpe"]
    for variant in variants * args.repeats:
        wall, cpu = prep_rate(cfg, tok, args.rows, variant)
        out.setdefault(f"prep_rows_per_s_{variant}", []).append(round(wall))
        out.setdefault(f"prep_cpu_rows_per_s_{variant}", []).append(round(cpu))
    for with_prep in [False, True] * args.repeats:
        key = "step_ms_with_prep" if with_prep else "step_ms_alone"
        out.setdefault(key, []).append(round(1000 * step_time(loaded, cfg, tok, with_prep), 2))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
