"""What reading a compressed line input costs: rows/s of the row reader and the id scan over a
JSONL (or CSV) file, plain and compressed with each codec, and the peak RSS of each read.

    python scripts/bench_compressed.py --rows 1000000 [--format csv] [--codecs .gz,.zst] [--repeats 3]

Rows are `{"id": "r000000000", "prompt": "Write one word that rhymes with <word> <n>."}`
(make_corpus.py's). Each measurement runs in a fresh process, so its peak RSS is its own.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pyarrow as pa

WORDS = ["apple", "river", "stone", "cloud", "tiger", "piano", "lemon", "candle", "rocket"]
CODECS = {".gz": "gzip", ".zst": "zstd", ".bz2": "bz2", ".lz4": "lz4"}
MEASURE = """
import json, resource, sys, time
from jobrunner.config import JobConfig
from jobrunner.formats import read_rows
from jobrunner.resume import scan_ids
path, what = sys.argv[1], sys.argv[2]
t = time.perf_counter()
if what == "rows":
    n = sum(1 for _ in read_rows(path))
else:
    n = scan_ids(JobConfig.model_validate({"input": {"path": path}}))[0]
s = time.perf_counter() - t
print(json.dumps({"rows": n, "s": s, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def write_plain(path: Path, rows: int, fmt: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        if fmt == "csv":
            f.write("id,prompt\n")
        for i in range(rows):
            prompt = f"Write one word that rhymes with {WORDS[i % len(WORDS)]} {i}."
            if fmt == "csv":
                f.write(f"r{i:09d},{prompt}\n")
            else:
                f.write(json.dumps({"id": f"r{i:09d}", "prompt": prompt}) + "\n")


def compress(plain: Path, suffix: str) -> Path:
    out = plain.with_name(plain.name + suffix)
    with pa.OSFile(str(plain)) as src, pa.CompressedOutputStream(str(out), CODECS[suffix]) as dst:
        while chunk := src.read(1 << 22):
            dst.write(chunk)
    return out


def measure(path: Path, what: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", MEASURE, str(path), what], capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--format", choices=["jsonl", "csv"], default="jsonl")
    ap.add_argument("--codecs", default=",".join(CODECS))
    ap.add_argument("--repeats", type=int, default=1)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        plain = Path(d) / f"corpus.{args.format}"
        write_plain(plain, args.rows, args.format)
        files = [plain, *(compress(plain, s) for s in args.codecs.split(","))]
        print(f"{args.rows:,} rows of {args.format}; rows/s (seconds, peak RSS)")
        for turn in range(args.repeats):  # the files alternate: a load change hits them alike
            print(f"turn {turn + 1}")
            for f in files:
                print(f"  {f.name:20s} {f.stat().st_size / 1e6:7.1f} MB  " + _cells(f, args.rows))


def _cells(f: Path, rows: int) -> str:
    got = {what: measure(f, what) for what in ("rows", "scan")}
    assert all(g["rows"] == rows for g in got.values()), got
    return "  ".join(
        f"{what} {rows / g['s'] / 1e3:,.0f}k ({g['s']:.2f} s, {g['rss_mb']:.0f} MB)"
        for what, g in got.items()
    )


if __name__ == "__main__":
    main()
