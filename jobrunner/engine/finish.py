"""Turn generated token ids into a Result: EOS, stop strings, finish reason. No torch.

Shared by every engine so they agree on what a completion is: text up to (not including) the
first EOS or stop string, `stop` when one of those ended it, `length` otherwise.
"""

from __future__ import annotations

from typing import Any

from jobrunner.types import FinishReason, Request, Result, Usage


def cut_at_eos(token_ids: list[int], eos: set[int], ignore_eos: bool) -> tuple[list[int], bool]:
    if ignore_eos:
        return token_ids, False
    for i, t in enumerate(token_ids):
        if t in eos:
            return token_ids[:i], True
    return token_ids, False


def find_stop(text: str, stops: tuple[str, ...]) -> int | None:
    """Index of the earliest stop string in text, or None."""
    hits = [i for s in stops if s and (i := text.find(s)) >= 0]
    return min(hits) if hits else None


def make_result(
    req: Request, token_ids: list[int], tokenizer: Any, eos: set[int], cached_tokens: int = 0
) -> Result:
    kept, hit_eos = cut_at_eos(token_ids, eos, req.sampling.ignore_eos)
    text = tokenizer.decode(kept, skip_special_tokens=True)
    stop_at = find_stop(text, req.sampling.stop)
    if stop_at is not None:
        text = text[:stop_at]
    reason = FinishReason.STOP if hit_eos or stop_at is not None else FinishReason.LENGTH
    n_completion = len(kept) + (1 if hit_eos else 0)  # the EOS token was generated and paid for
    usage = Usage(req.num_prompt_tokens, cached_tokens, n_completion)
    return Result(req.id, text, reason, usage, kept, req.source, req.columns, req.meta)


def error_result(req: Request, code: str, message: str, completion_tokens: int = 0) -> Result:
    usage = Usage(req.num_prompt_tokens, 0, completion_tokens)
    return Result(
        req.id,
        "",
        FinishReason.ERROR,
        usage,
        [],
        req.source,
        req.columns,
        req.meta,
        error_code=code,
        error=message,
    )
