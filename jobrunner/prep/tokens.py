"""Token ids of many short texts: byte-level BPE a pre-token at a time, cached.

A byte-level BPE tokenizer without a normalizer (GPT-2's design, SmolLM2's) encodes a text as
the concatenation of its pre-tokens' encodings: the GPT-2 regex splits the text, and the BPE
model encodes each piece alone. For ASCII text that regex has an exact ASCII form, so the pieces
are split here by `re` and each distinct piece is encoded once by the tokenizer's own BPE model
(`model.tokenize`) and then looked up: a corpus of short prompts repeats its words, and the
per-text cost of the batch call (regex, offsets, one Encoding object a text) is most of its
time. Every other text (non-ASCII, holding an added token's text, or when the tokenizer is of
another design) goes through the fast tokenizer's batch call, as before.
"""

from __future__ import annotations

import json
import re
from typing import Any

_WS = "\t\n\x0b\x0c\r "  # the ASCII characters of Unicode White_Space (not \x1c-\x1f)
# The GPT-2 pre-tokenizer pattern (tokenizers' ByteLevel, use_regex) over ASCII: \p{L} is
# [A-Za-z], \p{N} is [0-9], \s is _WS.
ASCII_SPLIT = re.compile(
    rf"'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^{_WS}A-Za-z0-9]+|[{_WS}]+(?![^{_WS}])"
    rf"|[{_WS}]+"
)
MAX_CACHED = 1 << 18  # distinct pre-tokens kept (a few tens of MB); the cache restarts past it
# Texts the fast path must agree on with the batch call before it is used (checked once).
PROBES = ("a", "Hello, world!", " two  spaces\tand\ttabs\n\n", "don't I'm we'll 's", "x1 22 333.")


def _byte_chars() -> dict[str, str]:
    """GPT-2's bytes_to_unicode for the ASCII bytes: the characters the BPE vocabulary uses."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    out, extra = {}, 0
    for b in range(256):
        if b in printable:
            c = b
        else:
            c, extra = 256 + extra, extra + 1
        if b < 128:
            out[chr(b)] = chr(c)
    return out


BYTE_CHARS = str.maketrans(_byte_chars())


class TextEncoder:
    """`encode(texts, add_special_tokens)` -> token ids per text, equal to the fast tokenizer's
    batch call (module doc); thread-safe for one producer."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._model = _byte_level_model(tokenizer)
        self._added = _added_tokens(tokenizer) if self._model is not None else None
        self._cache: dict[str, list[int]] = {}
        self._bare_special = self._model is not None and _specials_add_nothing(tokenizer)
        if self._model is not None and not self._agrees():
            self._model = None

    @property
    def fast(self) -> bool:
        """True when texts of the fast form skip the batch call."""
        return self._model is not None

    def encode(self, texts: list[str], add_special_tokens: bool) -> list[list[int]]:
        fast = self._model is not None and (self._bare_special or not add_special_tokens)
        out: list[Any] = [self._ids(t) if fast else None for t in texts]
        rest = [k for k, ids in enumerate(out) if ids is None]
        if rest:
            encoded = self.tokenizer(
                [texts[k] for k in rest], add_special_tokens=add_special_tokens
            )
            for k, ids in zip(rest, encoded["input_ids"], strict=True):
                out[k] = list(ids)
        return out

    def _ids(self, text: str) -> list[int] | None:
        """The text's ids by its pre-tokens, or None when it is not of the fast form."""
        if not text.isascii() or (self._added is not None and self._added.search(text)):
            return None
        cache, ids = self._cache, []
        for piece in ASCII_SPLIT.findall(text):
            found = cache.get(piece)
            if found is None:
                found = self._encode_piece(piece)
            ids += found
        return ids

    def _encode_piece(self, piece: str) -> list[int]:
        if len(self._cache) >= MAX_CACHED:
            self._cache = {}
        found = [t.id for t in self._model.tokenize(piece.translate(BYTE_CHARS))]
        self._cache[piece] = found
        return found

    def _agrees(self) -> bool:
        batch = self.tokenizer(list(PROBES), add_special_tokens=False)["input_ids"]
        return all(self._ids(p) == list(ids) for p, ids in zip(PROBES, batch, strict=True))


def _byte_level_model(tokenizer: Any) -> Any:
    """The BPE model of a fast tokenizer made of no normalizer and the plain GPT-2 byte-level
    pre-tokenizer; None for any other tokenizer."""
    backend = getattr(tokenizer, "_tokenizer", None)
    if backend is None or not hasattr(backend, "to_str"):
        return None
    try:
        spec = json.loads(backend.to_str())
    except Exception:  # a backend that cannot describe itself takes the batch call
        return None
    pre, model = spec.get("pre_tokenizer") or {}, spec.get("model") or {}
    plain = (
        spec.get("normalizer") is None
        and pre.get("type") == "ByteLevel"
        and pre.get("add_prefix_space") is False
        and pre.get("use_regex", True) is True
        and model.get("type") == "BPE"
        and not model.get("dropout")
        and not spec.get("truncation")
        and not spec.get("padding")
    )
    return backend.model if plain else None


def _added_tokens(tokenizer: Any) -> re.Pattern | None:
    """A pattern finding any added token's text (such texts take the batch call)."""
    contents = sorted(
        {t.content for t in getattr(tokenizer, "added_tokens_decoder", {}).values()}, key=len
    )
    return re.compile("|".join(map(re.escape, contents[::-1]))) if contents else None


def _specials_add_nothing(tokenizer: Any) -> bool:
    """True when add_special_tokens adds no token (SmolLM2: a post-processor of $A only)."""
    on = tokenizer(["a b"], add_special_tokens=True)["input_ids"][0]
    off = tokenizer(["a b"], add_special_tokens=False)["input_ids"][0]
    return list(on) == list(off)
