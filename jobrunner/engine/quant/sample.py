"""N prompts sampled from the job's input, for the quality gate and `quantize-check`."""

from __future__ import annotations

import random
from typing import Any

from jobrunner.formats import job_rows, make_preparer
from jobrunner.types import Request

SAMPLE_WINDOW = 4096  # rows read at most: a reservoir over the head of the input


def sample_requests(cfg: Any, tokenizer: Any, n: int, window: int = SAMPLE_WINDOW) -> list[Request]:
    """A seeded reservoir sample of n valid rows among the first `window` (input order kept)."""

    rng = random.Random(cfg.generation.seed)
    preparer = make_preparer(cfg, tokenizer)
    rows = job_rows(cfg.input)
    picked: list[tuple[int, Request]] = []
    seen = 0
    for item in preparer.prepare(rows):
        if not isinstance(item, Request) or not item.prompt_token_ids:
            continue
        if len(picked) < n:
            picked.append((seen, item))
        elif (j := rng.randrange(seen + 1)) < n:
            picked[j] = (seen, item)
        seen += 1
        if seen >= window:
            break
    return [r for _, r in sorted(picked, key=lambda p: p[0])]
