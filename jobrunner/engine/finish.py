"""Turn generated token ids into Choices and Results: end tokens, stop strings, finish reason,
usage and the text of logprob entries. No torch. Shared by every engine so they agree on what
a completion is.

A choice's `token_ids` are the tokens the row generated, up to and including the EOS or stop
token that ended it (each was computed and is counted in usage); its text is theirs without
that end token and up to (not including) the first stop string; `stop` when an end token or a
stop string ended it, `length` otherwise.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache
from typing import Any

from jobrunner.types import (
    Choice,
    FinishReason,
    Request,
    Result,
    TokenLogprob,
    Usage,
)


def cut_at_end(token_ids: list[int], ends: frozenset[int]) -> tuple[list[int], bool]:
    """The tokens up to and including the first end token, and whether there was one."""
    for i, t in enumerate(token_ids):
        if t in ends:
            return token_ids[: i + 1], True
    return token_ids, False


def find_stop(text: str, stops: tuple[str, ...], start: int = 0) -> int:
    """Index of the earliest stop string in text[start:] (as an index into text), or -1."""
    hits = [i for i in (text.find(s, start) for s in stops if s) if i >= 0]
    return min(hits) if hits else -1


def make_choice(
    tokenizer: Any,
    req: Request,
    token_ids: list[int],
    reason: FinishReason,
    ends: frozenset[int],
    logprobs: list[TokenLogprob] | None = None,
    text: str | None = None,
    structure: str | None = None,
) -> Choice:
    """A finished sample: its text (decoded here unless given), stop strings applied.
    `structure` is a constrained row's verdict; a stop string that cuts the text makes it
    "incomplete" (the value is no longer whole)."""
    if text is None:
        by_token = reason is FinishReason.STOP and token_ids and token_ids[-1] in ends
        text = tokenizer.decode(token_ids[:-1] if by_token else token_ids, skip_special_tokens=True)
        hit = find_stop(text, req.sampling.stop)
        if hit >= 0:
            text, reason = text[:hit], FinishReason.STOP
            structure = None if structure is None else "incomplete"
    if logprobs is not None:
        logprobs = name_tokens(logprobs[: len(token_ids)], tokenizer)
    return Choice(req.sample_index, text, list(token_ids), reason, logprobs, structure)


def make_result(
    req: Request, choices: list[Choice], cached_tokens: int = 0, work: Usage | None = None
) -> Result:
    """A row's Result; usage counts the tokens of every choice, over the engine's work fields."""
    usage = _usage(req, cached_tokens, sum(len(c.token_ids) for c in choices), work)
    return Result(req.id, choices, usage, req.source, req.columns, req.meta)


def error_result(
    req: Request,
    code: str,
    message: str,
    completion_tokens: int = 0,
    cached_tokens: int = 0,
    work: Usage | None = None,
) -> Result:
    """A failed row: no choices; usage still counts what it computed."""
    usage = _usage(req, cached_tokens, completion_tokens, work)
    return Result(
        req.id, [], usage, req.source, req.columns, req.meta, error_code=code, error=message
    )


def _usage(req: Request, cached: int, completion: int, work: Usage | None) -> Usage:
    return replace(
        work or Usage(),
        prompt_tokens=req.num_prompt_tokens,
        cached_tokens=cached,
        completion_tokens=completion,
    )


# ---------------------------------------------------------------------- logprob entries


def name_tokens(entries: list[TokenLogprob], tokenizer: Any) -> list[TokenLogprob]:
    """Fill each entry's (and alternative's) token text and bytes, in place."""
    every = [e for entry in entries for e in (entry, *entry.top_logprobs)]
    byte_level = _byte_level(tokenizer)
    pieces = tokenizer.convert_ids_to_tokens([e.token_id for e in every])
    for e, piece in zip(every, pieces, strict=True):
        e.bytes = _piece_bytes(piece) if byte_level else None
        e.token = (
            bytes(e.bytes).decode("utf-8", errors="replace")
            if e.bytes is not None
            else tokenizer.decode([e.token_id])
        )
        if e.bytes is None:
            e.bytes = list(e.token.encode("utf-8"))
    return entries


def _byte_level(tokenizer: Any) -> bool:
    """GPT-2-style byte-level BPE (pieces spell bytes, " a" is "Ġa"), as SmolLM2's and Qwen's."""
    try:
        ids = tokenizer.encode(" a", add_special_tokens=False)
        return tokenizer.convert_ids_to_tokens(ids) == ["\u0120a"]
    except Exception:
        return False


def _piece_bytes(piece: str | None) -> list[int] | None:
    """A byte-level BPE piece's bytes (GPT-2's byte-to-character map), else None."""
    table = _byte_decoder()
    if piece is None or not all(ch in table for ch in piece):
        return None
    return [table[ch] for ch in piece]


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    codes, extra = list(printable), 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            codes.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, codes, strict=True)}
