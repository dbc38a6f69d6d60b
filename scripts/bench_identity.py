"""What content identity costs at open time: the pre-scan of a large JSONL input, three ways.

  ids only:      the duplicate-id scan every run does (the cost before content identity)
  first run:     + the file's BLAKE2b hash and a digest per row (recorded once)
  resume:        + the size/mtime pre-check of an unchanged file (no hashing, no row digests)

usage: python scripts/bench_identity.py [ROWS] [PROMPT_CHARS]
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

from jobrunner.config import JobConfig
from jobrunner.formats import input_files
from jobrunner.input_scan import scan_input
from jobrunner.io.identity import file_records, input_root


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 200_000
    chars = int(sys.argv[2]) if len(sys.argv) > 2 else 400
    with tempfile.TemporaryDirectory() as d:
        inp = Path(d) / "in.jsonl"
        with open(inp, "w") as f:
            for i in range(n):
                f.write(json.dumps({"id": f"row-{i:08d}", "prompt": "x" * chars, "n": i}) + "\n")
        cfg = JobConfig.model_validate({"input": {"path": str(inp)}})
        files, root = input_files(str(inp)), input_root(str(inp))
        mb = inp.stat().st_size / 1e6

        def timed(fn) -> float:
            t = time.perf_counter()
            fn()
            return time.perf_counter() - t

        ids_only = timed(lambda: scan_input(cfg, set()))
        first = timed(lambda: (file_records(files, root, None), scan_input(cfg, {"in.jsonl"})))
        rec = file_records(files, root, None)
        resume = timed(lambda: (file_records(files, root, rec), scan_input(cfg, set())))
        hash_only = timed(lambda: file_records(files, root, None))
        print(f"{n} rows, {mb:.0f} MB")
        for name, s in [("ids only", ids_only), ("first run", first), ("resume", resume)]:
            print(f"  {name:10s} {s:7.2f} s  ({s / ids_only:.2f}x ids only)")
        print(f"  file hash alone {hash_only:.2f} s ({mb / hash_only:.0f} MB/s)")


if __name__ == "__main__":
    main()
