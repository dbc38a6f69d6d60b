"""Build data/samples/ reproducibly from real public text that ships with CPython.

Sources: the Python Language Reference topics (`pydoc_data.topics`, PSF licence) and the
docstrings of standard-library modules. Rows range from one-line questions to excerpts of over
1,000 tokens. Writes prompts.parquet and prompts.jsonl with the same rows:
  id, kind, source, text (the raw excerpt), prompt (the full instruction), messages (chat form);
and embeddings_batch.jsonl, OpenAI /v1/embeddings batch lines over the first rows' prompts (one
string, several strings, token ids, `dimensions`, base64).

    python scripts/make_samples.py [--out data/samples] [--rows 240]
"""

from __future__ import annotations

import argparse
import importlib
import json
import random
import textwrap
import warnings
from pathlib import Path

MODULES = [
    "argparse",
    "asyncio",
    "base64",
    "bisect",
    "calendar",
    "collections",
    "contextlib",
    "csv",
    "dataclasses",
    "datetime",
    "decimal",
    "difflib",
    "email",
    "enum",
    "fractions",
    "functools",
    "gzip",
    "hashlib",
    "heapq",
    "hmac",
    "html",
    "http",
    "inspect",
    "io",
    "ipaddress",
    "itertools",
    "json",
    "logging",
    "mailbox",
    "math",
    "mimetypes",
    "operator",
    "os",
    "pathlib",
    "pickle",
    "pprint",
    "queue",
    "random",
    "re",
    "sched",
    "secrets",
    "shlex",
    "shutil",
    "socket",
    "sqlite3",
    "statistics",
    "string",
    "struct",
    "subprocess",
    "tarfile",
    "tempfile",
    "textwrap",
    "threading",
    "timeit",
    "tokenize",
    "traceback",
    "typing",
    "unittest",
    "urllib",
    "uuid",
    "warnings",
    "wave",
    "weakref",
    "xml",
    "zipfile",
    "zlib",
]
QUESTIONS = [
    "In two sentences, what is the Python `{name}` feature for?",
    "Give one short code example that uses Python's `{name}`.",
    "What is a common mistake people make with Python's `{name}`?",
]
SIZES = [400, 1200, 2500, 5000, 9000]  # characters of excerpt: short to well over 1,000 tokens


def topic_rows(rng: random.Random) -> list[dict]:
    from pydoc_data.topics import topics

    rows = []
    for name, text in sorted(topics.items()):
        text = text.strip()
        size = SIZES[len(rows) % len(SIZES)]
        excerpt = cut(text, size)
        rows.append(
            row(
                "summarize",
                f"pydoc:{name}",
                excerpt,
                "Summarize the following section of the Python documentation in a few "
                f"bullet points.\n\n{excerpt}",
            )
        )
        q = rng.choice(QUESTIONS).format(name=name.replace("-", " "))
        rows.append(row("question", f"pydoc:{name}", "", q))
    return rows


def module_rows() -> list[dict]:
    rows = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in MODULES:
            doc = (importlib.import_module(name).__doc__ or "").strip()
            if len(doc) < 80:
                continue
            excerpt = cut(textwrap.dedent(doc), 3000)
            rows.append(
                row(
                    "explain",
                    f"module:{name}",
                    excerpt,
                    f"Explain to a new programmer what this Python module is for:\n\n{excerpt}",
                )
            )
    return rows


def cut(text: str, size: int) -> str:
    """At most `size` characters, ending at a paragraph or line boundary when possible."""
    if len(text) <= size:
        return text
    head = text[:size]
    for sep in ("\n\n", "\n", ". "):
        at = head.rfind(sep)
        if at > size // 2:
            return head[:at].rstrip()
    return head.rstrip()


def row(kind: str, source: str, text: str, prompt: str) -> dict:
    return {
        "kind": kind,
        "source": source,
        "text": text,
        "prompt": prompt,
        "messages": [{"role": "user", "content": prompt}],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="data/samples")
    ap.add_argument("--rows", type=int, default=240)
    args = ap.parse_args()
    rng = random.Random(0)
    rows = topic_rows(rng) + module_rows()
    rng.shuffle(rows)
    rows = [dict(r) for r in (rows * (args.rows // len(rows) + 1))[: args.rows]]
    for i, r in enumerate(rows):
        r["id"] = f"s{i:05d}"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cols = ["id", "kind", "source", "prompt", "text", "messages"]
    rows = [{c: r[c] for c in cols} for r in rows]
    with open(out / "prompts.jsonl", "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), out / "prompts.parquet")
    print(f"wrote {len(rows)} rows to {out}/prompts.parquet and prompts.jsonl")
    with open(out / "embeddings_batch.jsonl", "w", encoding="utf-8") as f:
        for line in embedding_lines([r["prompt"] for r in rows]):
            f.write(json.dumps(line, ensure_ascii=False) + "\n")


def embedding_lines(prompts: list[str]) -> list[dict]:
    """/v1/embeddings lines: the first prompt lines of the rows, in each input shape."""
    texts = [p.splitlines()[0][:400] for p in prompts[:24]]
    bodies = [{"input": t} for t in texts[:8]]
    bodies += [{"input": texts[8:12]}, {"input": texts[12:16], "dimensions": 128}]
    bodies += [{"input": texts[16], "encoding_format": "base64"}]
    bodies += [{"input": [101, 7592, 2088, 102]}, {"input": [[101, 7592, 102], [101, 2088, 102]]}]
    bodies += [{"input": t, "dimensions": 64} for t in texts[17:24]]
    return [
        {
            "custom_id": f"emb-{i + 1}",
            "method": "POST",
            "url": "/v1/embeddings",
            "body": {"model": "text-embedding-3-small", **b},
        }
        for i, b in enumerate(bodies)
    ]


if __name__ == "__main__":
    main()
