"""What the native-call tests share (test_bf16_cpu.py, test_decode_layers.py): a config whose
longer prompts span several steps, each row's tokens and log-probabilities from an engine, and
a model changed between steps reaching the native call, and a record of the native calls."""

from __future__ import annotations

from collections.abc import Callable

from jobrunner.config import JobConfig
from jobrunner.types import Request, SamplingParams


def several_steps() -> JobConfig:
    cfg = JobConfig()
    cfg.engine.kv_cache_bytes = 64 << 20
    cfg.engine.max_batch_tokens = 96  # the longer prompts span steps
    return cfg


def tokens_and_logprobs(engine, prompts) -> dict:
    params = SamplingParams(max_new_tokens=6, logprobs=True, top_logprobs=3)
    reqs = [Request(str(i), ids, params) for i, ids in enumerate(prompts)]
    return {r.id: (r.token_ids, r.choices[0].logprobs) for r in engine.generate(reqs)}


def swap_reaches_native_steps(engine, prompts, swap: Callable[[], Callable[[], None]]) -> None:
    """Runs the prompts, then `swap()` (which returns its undo) changes the model: decode steps
    in the native call then give what the layer loop gives on the changed model, and not what
    the first run gave (the swap changed what the steps compute). The swap is undone after."""
    original = tokens_and_logprobs(engine, prompts)  # the table built from the first model
    undo = swap()
    try:
        native = tokens_and_logprobs(engine, prompts)
        engine.model.native = None
        assert native == tokens_and_logprobs(engine, prompts)
        assert native != original
    finally:
        undo()


def native_calls(monkeypatch) -> list[bool]:
    """What each NativeLayers.run returns from now on: True where a step ran in the native
    call, False where it declined and the layer loop ran."""
    from jobrunner.engine.paged.native_layers import NativeLayers

    took, real = [], NativeLayers.run
    monkeypatch.setattr(NativeLayers, "run", lambda *a: took.append(real(*a)) or took[-1])
    return took
