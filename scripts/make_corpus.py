"""Generate a large Parquet corpus of short prompts for the memory and speed measurements.

    python scripts/make_corpus.py /path/corpus.parquet --rows 100000000

Rows are `{id: "r000000000", prompt: "Write one word that rhymes with <word> <n>."}`, written a
million at a time (vectorized, in bounded memory), 128k rows a row group.
"""

from __future__ import annotations

import argparse

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

WORDS = ["apple", "river", "stone", "cloud", "tiger", "piano", "lemon", "candle", "rocket"]
CHUNK = 1_000_000


def chunk(start: int, n: int) -> pa.Table:
    rows = np.arange(start, start + n)
    num = pc.cast(pa.array(rows), pa.string())
    ids = pc.binary_join_element_wise("r", pc.utf8_lpad(num, 9, "0"), "")
    words = pa.array(WORDS).take(pa.array(rows % len(WORDS)))
    prompt = pc.binary_join_element_wise(
        "Write one word that rhymes with", words, pc.binary_join_element_wise(num, ".", ""), " "
    )
    return pa.table({"id": ids, "prompt": prompt})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("path")
    ap.add_argument("--rows", type=int, default=100_000_000)
    args = ap.parse_args()
    first = chunk(0, min(CHUNK, args.rows))
    with pq.ParquetWriter(args.path, first.schema, compression="zstd") as w:
        w.write_table(first, row_group_size=128 * 1024)
        for start in range(CHUNK, args.rows, CHUNK):
            w.write_table(chunk(start, min(CHUNK, args.rows - start)), row_group_size=128 * 1024)
    print(f"{args.rows} rows -> {args.path}")


if __name__ == "__main__":
    main()
