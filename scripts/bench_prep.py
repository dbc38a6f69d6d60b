"""Preparation speed (read, render, tokenize) and its cost to the engine, in one process.

    python scripts/bench_prep.py --corpus /work/scale/corpus-1000000.parquet --rows 200000

1. rows/s of Preparer.prepare over the corpus (wall and CPU time), alternated in the same
   process: the chat template rendered per row through Jinja, the whole text through the fast
   tokenizer's batch call; the frame rendered once (prep/render.py), the user text through the
   batch call; the frame, the user text by cached byte-level BPE pieces (prep/tokens.py); then
   the whole first stage of a run (Prep over FreshRows: the committed check, dedup, ordering),
   with Python's default garbage collection and as a run settles it (collector.py);
2. the paged engine's mean forward time a step, decoding a fixed batch: alone, with preparation
   running without pause in another thread (the worst case: every row of a large input still to
   prepare), and pulling its rows from a PrepStream as a run does; the last two again under a
   shorter GIL switch interval (`--switch-interval`): the engine thread, which gives the GIL up
   around every torch op, waits up to that long to get it back from a busy preparation thread.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import threading
import time

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # what the CLI sets
os.environ.setdefault("HF_HUB_OFFLINE", "1")

VARIANTS = [
    "jinja_per_row",
    "framed_batch_call",
    "framed_cached_bpe",
    "stage_default_gc",
    "stage_settled_gc",
]


def prep_rate(cfg, tok, rows: int, variant: str) -> tuple[float, float]:
    """(rows/s of wall time, rows/s of this process's CPU time)."""
    from jobrunner.collector import settled
    from jobrunner.formats import make_preparer, read_rows
    from jobrunner.prep.fresh import FreshRows
    from jobrunner.prep.stream import Prep
    from jobrunner.prep.tokens import TextEncoder

    if variant.startswith("stage"):
        prep = Prep(cfg, tok)
        gc_mode = settled() if variant == "stage_settled_gc" else contextlib.nullcontext()
        t, c = time.perf_counter(), time.process_time()
        with gc_mode:
            n = sum(1 for _ in itertools.islice(prep.requests(FreshRows(cfg, set())), rows))
        return n / (time.perf_counter() - t), n / (time.process_time() - c)
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


def step_time(loaded, cfg, tok, mode: str) -> float:
    """Mean forward time a step (ms) of 16 rows decoding 64 tokens each."""
    from jobrunner.engine.engines import make_engine
    from jobrunner.formats import make_preparer, read_rows
    from jobrunner.prep.stream import PrepStream

    engine = make_engine(loaded, cfg)
    stop = threading.Event()

    def background() -> None:
        p = make_preparer(cfg, tok)
        for _ in p.prepare(read_rows(cfg.input.path)):
            if stop.is_set():
                return

    if mode == "stream":  # a run's stage 1: a bounded queue, filled while the engine steps
        stream = PrepStream(cfg, tok, set()).start()
        rows = itertools.islice(stream.stream(), cfg.engine.max_num_seqs)
    else:
        prep = make_preparer(cfg, tok)
        rows = iter(list(itertools.islice(prep.prepare(read_rows(cfg.input.path)), 16)))
        stream = None
    thread = threading.Thread(target=background, daemon=True)
    if mode == "with_prep":
        thread.start()
    for _ in engine.generate(rows):
        pass
    stop.set()
    if stream is not None:
        stream.stop()
    thread.join() if mode == "with_prep" else None
    st = engine.stats
    return 1000 * st.forward_seconds / max(st.steps, 1)


def main() -> None:
    from jobrunner.config import JobConfig
    from jobrunner.engine.loader import load_model

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--only", default="prep,steps")
    ap.add_argument(
        "--switch-interval",
        type=float,
        default=0.0005,
        help="the GIL switch interval (s) of the second round of step times",
    )
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
    if "prep" in args.only:
        for variant in VARIANTS * args.repeats:
            wall, cpu = prep_rate(cfg, tok, args.rows, variant)
            out.setdefault(f"prep_rows_per_s_{variant}", []).append(round(wall))
            out.setdefault(f"prep_cpu_rows_per_s_{variant}", []).append(round(cpu))
    if "steps" in args.only:
        import sys

        default = sys.getswitchinterval()
        modes = [("alone", default), ("with_prep", default), ("stream", default)]
        modes += [(m, args.switch_interval) for m in ("with_prep", "stream")]
        for mode, interval in modes * args.repeats:
            sys.setswitchinterval(interval)
            ms = round(step_time(loaded, cfg, tok, mode), 2)
            tag = "" if interval == default else f"_switch_{interval * 1000:g}ms"
            out.setdefault(f"step_ms_{mode}{tag}", []).append(ms)
        sys.setswitchinterval(default)
    out["load_average"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
