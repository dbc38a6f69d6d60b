"""The Ray driver's share of a job at corpus scale: planning the blocks, without a cluster.

    python scripts/bench_ray_plan.py --corpus /tmp/scale/corpus-10000000.parquet
    python scripts/bench_ray_plan.py --corpus /tmp/scale/corpus-1000000.parquet --pickled
    python scripts/bench_ray_plan.py --corpus /tmp/scale/corpus-1000000.jsonl [--pickled]

Prints the driver's peak RSS, seconds and the bytes of block payloads it would hand to Ray
(`executors/ray_blocks.plan_blocks`, ray.block_rows 256, half the rows committed with
`--committed`). `--pickled` takes the path CSV takes (the driver reads every row and pickles
it into the blocks), the way Parquet was planned before blocks named row ranges and JSONL before
blocks named spans of lines. A `.jsonl` corpus is `make_corpus.py`'s rows as JSON lines.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import resource
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--block-rows", type=int, default=256)
    ap.add_argument("--committed", type=int, default=0, help="the first N ids count as done")
    ap.add_argument("--pickled", action="store_true")
    args = ap.parse_args()

    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    import jobrunner.executors.ray_blocks as ray_blocks
    from jobrunner.config import JobConfig
    from jobrunner.io.ids import IdSet, hash_ids

    cfg = JobConfig.model_validate({"input": {"path": args.corpus}})
    num = pc.cast(pa.array(np.arange(args.committed)), pa.string())
    done = IdSet(hash_ids(pc.binary_join_element_wise("r", pc.utf8_lpad(num, 9, "0"), "")))
    if args.pickled:
        line_format = ray_blocks.input_format
        ray_blocks.metadata_rows = lambda cfg: None
        ray_blocks.input_format = lambda name: dataclasses.replace(
            line_format(name), parse_line=None
        )
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    t = time.monotonic()
    plan = ray_blocks.plan_blocks(cfg, done, args.block_rows)
    out = {
        "path": "pickled rows" if args.pickled else "file + row ranges or line spans",
        "rows": plan.rows,
        "skipped": plan.skipped,
        "blocks": len(plan.blocks),
        "payload_mb": round(sum(len(b["payload"]) for b in plan.blocks) / 2**20, 1),
        "seconds": round(time.monotonic() - t, 1),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "rss_before_plan_mb": round(base),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
