"""Preparation speed (read, render, tokenize) and its cost to the engine, in one process.

    python scripts/bench_prep.py --corpus /work/scale/corpus-1000000.parquet --rows 50000

1. rows/s of Preparer.prepare over the corpus: the chat template rendered per row through
   Jinja and the whole text tokenized (the old path), against the frame rendered once with only
   the user text tokenized (prep/render.py), alternated in the same process;
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


def prep_rate(cfg, tok, rows: int, framed: bool) -> float:
    from jobrunner.formats import make_preparer, read_rows

    prep = make_preparer(cfg, tok)
    if not framed:
        prep.renderer.__dict__["_frame"] = None  # cached_property: force the per-row path
        prep.renderer.__dict__["frame_token_ids"] = None
    items = itertools.islice(read_rows(cfg.input.path), rows)
    t = time.perf_counter()
    n = sum(1 for _ in prep.prepare(items))
    return n / (time.perf_counter() - t)


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
    for framed in [False, True] * args.repeats:
        key = "prep_rows_per_s_framed" if framed else "prep_rows_per_s_jinja_per_row"
        out.setdefault(key, []).append(round(prep_rate(cfg, tok, args.rows, framed)))
    for with_prep in [False, True] * args.repeats:
        key = "step_ms_with_prep" if with_prep else "step_ms_alone"
        out.setdefault(key, []).append(round(1000 * step_time(loaded, cfg, tok, with_prep), 2))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
