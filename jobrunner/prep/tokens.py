"""Token ids of many short texts: byte-level BPE a pre-token at a time, cached.

A byte-level BPE tokenizer without a normalizer (GPT-2's design, SmolLM2's) encodes a text as
the concatenation of its pre-tokens' encodings: the GPT-2 regex splits the text, and the BPE
model encodes each piece alone. For ASCII text that regex has an exact ASCII form, so the pieces
are split here by `re` and each distinct piece is encoded once by the tokenizer's own BPE model
(`model.tokenize`) and then looked up: a corpus of short prompts repeats its words, and the
per-text cost of the batch call (regex, offsets, one Encoding object a text) is most of its
time. Where no token of the vocabulary holds a digit with anything else (SmolLM2's), a number
is its digits' tokens, looked up without the BPE model or the cache (`digit_ids`). Every other text (non-ASCII, holding an added token's text, or when the tokenizer is of
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


class PieceIds(dict):
    """Pre-token -> its token ids by the BPE model, encoded on first lookup (`__missing__`), so
    a text's ids are one lookup a piece; at most MAX_CACHED pieces are kept (past
    that the older half is dropped: a corpus of unique numbers keeps its words cached)."""

    def __init__(self, model: Any, digits: dict[str, int] | None = None) -> None:
        super().__init__()
        self.model = model
        self.digits = digits  # digit pieces by their characters' ids (`digit_ids`), not kept

    def __missing__(self, piece: str) -> list[int]:
        digits = self.digits
        if digits is not None and (piece[1:] if piece[0] == " " else piece).isdigit():
            return [digits[c] for c in piece]  # numbers are mostly unique: not cached
        if len(self) >= MAX_CACHED:
            for old in list(self)[: MAX_CACHED // 2]:  # insertion order: the oldest half
                del self[old]
        found = [t.id for t in self.model.tokenize(piece.translate(BYTE_CHARS))]
        self[piece] = found
        return found


class TextEncoder:
    """`encode(texts, add_special_tokens)` -> token ids per text, equal to the fast tokenizer's
    batch call (module doc); thread-safe for one producer."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        spec = _spec(tokenizer)
        self._model = _byte_level_model(tokenizer, spec)
        self._added = _added_tokens(tokenizer) if self._model is not None else None
        self._added_starts = _added_starts(tokenizer) if self._added is not None else ""
        self._cache = PieceIds(self._model, digit_ids(spec) if self._model is not None else None)
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
        if not text.isascii() or (self._added is not None and self._holds_added(text)):
            return None
        cache, ids = self._cache, []
        for piece in ASCII_SPLIT.findall(text):
            ids += cache[piece]
        return ids

    def _holds_added(self, text: str) -> bool:
        """Whether an added token's text is in `text`; the pattern runs only when a character
        such a token starts with is there (SmolLM2's all start with "<")."""
        for c in self._added_starts:
            if c in text:
                return self._added.search(text) is not None
        return not self._added_starts

    def _agrees(self) -> bool:
        batch = self.tokenizer(list(PROBES), add_special_tokens=False)["input_ids"]
        return all(self._ids(p) == list(ids) for p, ids in zip(PROBES, batch, strict=True))


def _spec(tokenizer: Any) -> dict | None:
    """The fast tokenizer's own description (tokenizer.json), or None."""
    backend = getattr(tokenizer, "_tokenizer", None)
    if backend is None or not hasattr(backend, "to_str"):
        return None
    try:
        return json.loads(backend.to_str())
    except Exception:  # a backend that cannot describe itself takes the batch call
        return None


def _byte_level_model(tokenizer: Any, spec: dict | None) -> Any:
    """The BPE model of a fast tokenizer made of no normalizer and the plain GPT-2 byte-level
    pre-tokenizer; None for any other tokenizer."""
    if spec is None:
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
    return tokenizer._tokenizer.model if plain else None


def digit_ids(spec: dict) -> dict[str, int] | None:
    """{" " and each digit: its one token id} when no other token of the vocabulary holds a
    digit (SmolLM2's), so BPE can never merge one: a piece " 123" is then the space's token and
    one token a digit, with no BPE call; None where a token holds digits with more."""
    model = spec.get("model") or {}
    vocab = model.get("vocab")
    if not isinstance(vocab, dict) or model.get("continuing_subword_prefix"):
        return None
    if model.get("end_of_word_suffix"):
        return None
    chars = {c: c.translate(BYTE_CHARS) for c in " 0123456789"}
    if any(v not in vocab for v in chars.values()):
        return None
    if any(len(t) > 1 and any(d in t for d in "0123456789") for t in vocab):
        return None
    return {c: vocab[v] for c, v in chars.items()}


def _added_tokens(tokenizer: Any) -> re.Pattern | None:
    """A pattern finding any added token's text (such texts take the batch call)."""
    contents = sorted(
        {t.content for t in getattr(tokenizer, "added_tokens_decoder", {}).values()}, key=len
    )
    return re.compile("|".join(map(re.escape, contents[::-1]))) if contents else None


def _added_starts(tokenizer: Any) -> str:
    """The first characters of the added tokens' texts, if few (else "": always search)."""
    contents = [t.content for t in getattr(tokenizer, "added_tokens_decoder", {}).values()]
    starts = {c[0] for c in contents if c}
    return "".join(sorted(starts)) if len(starts) <= 4 and all(contents) else ""


def _specials_add_nothing(tokenizer: Any) -> bool:
    """True when add_special_tokens adds no token (SmolLM2: a post-processor of $A only)."""
    on = tokenizer(["a b"], add_special_tokens=True)["input_ids"][0]
    off = tokenizer(["a b"], add_special_tokens=False)["input_ids"][0]
    return list(on) == list(off)


def pieces_ids(tokenizer: Any, texts: list[tuple[tuple[str, bool], ...]]) -> list[list[int]]:
    """Token ids of texts made of (piece, content) pairs: a template's piece with its special
    tokens read as such, a content piece with special-token text read as its characters
    (`split_special_tokens`); one batch call for each kind over every text. Pieces are
    tokenized apart: across a boundary inside a run of text this can differ from the whole
    text's tokens (a SentencePiece tokenizer's word prefix): SegmentEncoder avoids it."""
    flat = [(k, piece, content) for k, pieces in enumerate(texts) for piece, content in pieces]
    ids: dict[int, list[int]] = {}
    for content in (False, True):
        todo = [j for j, f in enumerate(flat) if f[2] is content]
        if todo:
            encoded = tokenizer(
                [flat[j][1] for j in todo], add_special_tokens=False, split_special_tokens=content
            )["input_ids"]
            ids.update(zip(todo, map(list, encoded), strict=True))
    out: list[list[int]] = [[] for _ in texts]
    for j, (k, _, _) in enumerate(flat):
        out[k] += ids[j]
    return out


MARK = "\ue000{}\ue001"  # a special token's stand-in (private-use characters around its id)


class SegmentEncoder:
    """Token ids of (piece, content) texts (pieces_ids) as the tokenizer reads the whole text,
    only the special-token text inside content read as characters: a copy of the fast
    tokenizer whose special tokens are matched by a stand-in (MARK) instead of their text
    encodes the text with the template's special tokens written as stand-ins. Tokenizing the
    pieces apart adds a word prefix (SentencePiece's "▁") at every boundary: "[INST]  hi".
    A tokenizer this cannot copy, or a content holding a stand-in's character, gets
    pieces_ids."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        copied = _marked_copy(tokenizer)
        self.backend, self.marks = copied if copied else (None, {})
        by_length = sorted(self.marks, key=len, reverse=True)  # the longest text first
        self.pattern = re.compile("|".join(map(re.escape, by_length)))

    def encode(self, texts: list[tuple[tuple[str, bool], ...]]) -> list[list[int]]:
        if self.backend is None:
            return pieces_ids(self.tokenizer, texts)
        marked = [k for k, t in enumerate(texts) if not _holds_mark(t)]
        rest = [k for k, t in enumerate(texts) if _holds_mark(t)]
        out: list[list[int]] = [[] for _ in texts]
        if marked:
            joined = [self._joined(texts[k]) for k in marked]
            encoded = self.backend.encode_batch(joined, add_special_tokens=False)
            for k, enc in zip(marked, encoded, strict=True):
                out[k] = list(enc.ids)
        if rest:
            for k, ids in zip(
                rest, pieces_ids(self.tokenizer, [texts[k] for k in rest]), strict=True
            ):
                out[k] = ids
        return out

    def _joined(self, pieces: tuple[tuple[str, bool], ...]) -> str:
        """The text, the template's special tokens written as their stand-ins."""
        mark = self.marks.__getitem__
        return "".join(
            p if content else self.pattern.sub(lambda m: mark(m.group()), p)
            for p, content in pieces
        )


def _holds_mark(pieces: tuple[tuple[str, bool], ...]) -> bool:
    """A content that holds a stand-in's character could forge a special token with it."""
    return any(content and "\ue000" in p for p, content in pieces)


def _marked_copy(tokenizer: Any) -> tuple[Any, dict[str, str]] | None:
    """(the fast tokenizer's backend with each special token's text replaced by its MARK, in
    its added tokens and its model's vocabulary so that the ids stay; special text -> MARK), or
    None where it cannot be copied so (a slow tokenizer, a vocabulary of another shape, two
    special tokens of one text) or the copy's marks do not encode to their ids."""
    backend = getattr(tokenizer, "_tokenizer", None)
    if backend is None or not hasattr(backend, "to_str"):
        return None
    from tokenizers import Tokenizer

    data = json.loads(backend.to_str())
    data["truncation"] = data["padding"] = None  # the caller's call sets these, per call
    vocab = (data.get("model") or {}).get("vocab")
    specials = [t for t in data.get("added_tokens", []) if t.get("special") and t.get("content")]
    marks = {t["content"]: MARK.format(t["id"]) for t in specials}
    if not marks or len(marks) != len(specials):
        return None
    for t in specials:
        mark, i = marks[t["content"]], t["id"]
        if isinstance(vocab, dict) and vocab.get(t["content"]) == i:
            vocab[mark] = vocab.pop(t["content"])
        elif isinstance(vocab, list) and i < len(vocab) and vocab[i][0] == t["content"]:
            vocab[i] = [mark, *vocab[i][1:]]  # Unigram: [piece, score]
        t["content"] = mark
    try:
        copy = Tokenizer.from_str(json.dumps(data))
    except Exception:  # a tokenizer file this version of tokenizers reads otherwise
        return None
    got = [e.ids for e in copy.encode_batch(list(marks.values()), add_special_tokens=False)]
    return (copy, marks) if got == [[t["id"]] for t in specials] else None
