"""`jobrunner estimate --calibrate N`: run N of the job's rows on this device with the real model
and add the measured steps to its profile (telemetry.profile), for the step model to fit.

A fit can only separate the terms that vary on their own in the steps it sees, and it
extrapolates to the lengths it has not seen. So the rows span the job's prompt lengths (the
shortest and the longest included, not a random few that are mostly typical), and they run in
three groups: the shortest rows, the longest ones, then all of them. The first two decode the
same number of rows over different contexts (the KV-read term apart from the per-row one), the
last a larger batch (the per-row term apart from the fixed one), and their prefill steps differ
in length (the per-token term apart from attention, quadratic in a prompt's length). Where the
job's prompts are all short, one more row of LONG_PROMPT_TOKENS (the job's own tokens, repeated)
runs with the longest group, so that the profile a later job of long prompts fits on has
measured prefill attention and KV reads that deep.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from jobrunner.config import JobConfig
from jobrunner.telemetry.profile import record

LONG_PROMPT_TOKENS = 1024  # the deepest prompt a calibration measures when the job has none
LONG_NEW_TOKENS = 16  # the long row's decode steps, each reading its whole context
POOL_PER_ROW = 8  # rows kept per calibration row while scanning, to choose lengths from
LONG_ID = "#calibrate-long"


def spread_by_length(pool: list[Any], n: int) -> list[Any]:
    """`n` requests of `pool` at evenly spaced ranks of prompt length, the shortest and the
    longest included (each request once)."""
    rows = sorted({id(r): r for r in pool}.values(), key=lambda r: r.num_prompt_tokens)
    if len(rows) <= n:
        return rows
    if n == 1:
        return [rows[-1]]
    return [rows[round(i * (len(rows) - 1) / (n - 1))] for i in range(n)]


def calibration_groups(sample: list[Any], max_model_len: int) -> list[list[Any]]:
    """The batches a calibration runs, one after another: the shortest quarter of the sample,
    the longest quarter (with the long row where the sample has no prompt that deep), all."""
    rows = sorted(sample, key=lambda r: r.num_prompt_tokens)
    k = max(1, len(rows) // 4)
    long_row = stretched_row(rows, max_model_len)
    groups = [rows[:k], rows[-k:] + ([long_row] if long_row else []), rows]
    return [g for g in groups if g]


def stretched_row(rows: list[Any], max_model_len: int) -> Any | None:
    """A request of the sample's prompt tokens repeated to LONG_PROMPT_TOKENS (within the
    context), ignoring EOS for LONG_NEW_TOKENS; None when a sampled prompt is that long.

    It starts one token into the repeated text, so that no block of it matches a sampled
    prompt's first blocks in the prefix cache: its prompt is computed, not looked up."""
    length = min(LONG_PROMPT_TOKENS, max_model_len - LONG_NEW_TOKENS - 1)
    ids = [t for r in rows for t in r.prompt_token_ids]
    if not rows or not ids or rows[-1].num_prompt_tokens >= length:
        return None
    repeated = ids * (1 + (length + 1) // len(ids))
    base = rows[-1]
    sampling = dataclasses.replace(
        base.sampling,
        max_new_tokens=LONG_NEW_TOKENS,
        ignore_eos=True,
        min_tokens=0,
        stop=(),
        stop_token_ids=(),
        n=1,
        structured=None,
    )
    return dataclasses.replace(
        base,
        id=f"{base.id}{LONG_ID}",
        prompt_token_ids=repeated[1 : length + 1],
        sampling=sampling,
        source=None,
        sample_index=0,
    )


def calibrate_run(cfg: JobConfig, sample: list[Any], key: str) -> float:
    """Generate the sample's groups with the real model, add the measured steps to this
    device's profile (`key`), and return the share of max_new_tokens the rows that may stop
    used (in the last group, where each sampled row runs once)."""
    if not sample:
        raise ValueError("no valid rows to calibrate on")
    engine, load_s = _start(cfg)
    results = []
    for group in calibration_groups(sample, cfg.model.max_model_len):
        results = list(engine.generate(iter(group)))
    share = completion_share(sample, results)
    record(
        key,
        steps=engine.stats.step_log,
        load_seconds=load_s,
        engine_seconds=engine.stats.engine_seconds,
        completion_fraction=share,
    )
    return 1.0 if share is None else share


def completion_share(sample: list[Any], results: list[Any]) -> float | None:
    """Completion tokens over max_new_tokens (times n) of the results whose rows may stop at
    EOS; None when none may."""
    by_id = {r.id: r for r in sample}
    used = [
        (r.usage.completion_tokens, by_id[r.id].sampling.max_new_tokens * by_id[r.id].sampling.n)
        for r in results
        if r.ok and r.id in by_id and not by_id[r.id].sampling.ignore_eos
    ]
    bound = sum(b for _, b in used)
    return sum(u for u, _ in used) / bound if bound else None


def _start(cfg: JobConfig) -> tuple[Any, float]:
    """The job's engine on its weights (quantized as the job runs them), warmed up as
    start_engine does (its one-off work is load time), and the seconds a run's load would
    take: these, less first-use work a run finds cached (the kernels' build, the dtype probe),
    plus the imports a run pays before its model (timed in a fresh interpreter, since this
    process has imported them; a run's are about half its load on a CPU)."""
    from jobrunner.engine import first_use
    from jobrunner.engine.engines import make_engine
    from jobrunner.engine.loader import load_model
    from jobrunner.engine.quant import apply_quantization
    from jobrunner.engine.start import fresh_import_seconds

    imports = fresh_import_seconds() or 0.0
    from transformers import PreTrainedModel  # noqa: F401  (counted in `imports`, not again)

    t0, cached_before = time.monotonic(), first_use.spent()
    loaded = load_model(cfg.model)
    apply_quantization(loaded, cfg.model)
    engine = make_engine(loaded, cfg)
    engine.warm_up()
    once = first_use.spent() - cached_before
    return engine, imports + max(time.monotonic() - t0 - once, 0.0)
