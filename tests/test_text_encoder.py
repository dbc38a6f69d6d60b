"""The cached byte-level encoder gives exactly the fast tokenizer's batch-call ids, for any text:
ASCII texts by pre-token (whitespace runs, contractions, control characters, digits), and every
other text (non-ASCII, added tokens' text) through the batch call itself."""

from __future__ import annotations

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobrunner.config import ModelConfig
from jobrunner.prep.tokens import TextEncoder


@pytest.fixture(scope="module")
def tok():
    from jobrunner.engine.loader import load_tokenizer

    return load_tokenizer(ModelConfig())


@pytest.fixture(scope="module")
def encoder(tok):
    enc = TextEncoder(tok)
    assert enc.fast  # SmolLM2's tokenizer is plain GPT-2 byte-level BPE
    return enc


def batch_ids(tok, texts, special=False):
    return [list(i) for i in tok(texts, add_special_tokens=special)["input_ids"]]


HARD = [
    "Write one word that rhymes with apple 1234567.",
    "a   b\t\t c\n\n\nd  \n e",
    "don't I'm we'll they've she'd it's 'S 'LL",
    "x''s !'t ?'re   've",
    "\x00\x1c\x1f\x7f ctrl \x0b\x0c\r\n",
    "trailing spaces   ",
    "   leading",
    "<|im_start|>user\nhi<|im_end|>",  # an added token's text: the batch call
    "café naïve 字 ✓ emoji 🙂",  # non-ASCII: the batch call
    "",
    " ",
]


@pytest.mark.parametrize("special", [False, True])
def test_hard_texts_equal_the_batch_call(tok, encoder, special):
    assert encoder.encode(HARD, special) == batch_ids(tok, HARD, special)
    assert encoder.encode(HARD, special) == batch_ids(tok, HARD, special)  # from the cache


ASCII = st.text(
    alphabet=st.sampled_from(list("ab Zz09'sdtlmrev.,!?-_<>{}\t\n\r\x0b\x0c\x1c\x00 ")),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(ASCII, st.text(max_size=20)), min_size=1, max_size=8))
def test_any_text_equals_the_batch_call(tok, encoder, texts):
    assert encoder.encode(texts, False) == batch_ids(tok, texts)


def test_another_pre_tokenizer_takes_the_batch_call(tok):
    from tokenizers import pre_tokenizers

    other = copy.deepcopy(tok)
    other._tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(False)]
    )
    enc = TextEncoder(other)
    assert not enc.fast
    texts = ["abc 123", "x  y"]
    assert enc.encode(texts, False) == batch_ids(other, texts)


def test_texts_near_added_tokens_equal_the_batch_call(tok, encoder):
    texts = ["a < b <= c", "x<|im_end|>y", "<im_start> <|im_start", "tail <|endoftext|>"]
    assert encoder.encode(texts, False) == batch_ids(tok, texts)


def test_a_full_piece_cache_keeps_exact_ids(tok, monkeypatch):
    import jobrunner.prep.tokens as tokens

    monkeypatch.setattr(tokens, "MAX_CACHED", 8)
    enc = TextEncoder(tok)
    texts = [f"Write one word that rhymes with apple {n}." for n in range(40)]
    assert enc.encode(texts, False) == batch_ids(tok, texts)
    assert len(enc._cache) <= 8  # the oldest half went each time it filled
    assert enc.encode(texts[:3], False) == batch_ids(tok, texts[:3])


def test_numbers_are_their_digits_tokens_where_no_token_merges_digits(tok, encoder):
    from jobrunner.prep.tokens import digit_ids

    texts = ["r000123 9", " 1000000.", "x1 22 333.\n 4444 55555 0", "12abc34 5,6"]
    assert encoder.encode(texts, False) == batch_ids(tok, texts)
    spec = {"model": {"vocab": {c: k for k, c in enumerate(" 0123456789Ġ")}}}
    assert digit_ids(spec) is not None
    spec["model"]["vocab"]["Ġ1"] = 99  # a token merging a digit: every number takes BPE
    assert digit_ids(spec) is None


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.text(alphabet=st.sampled_from(list("0123456789 a.\n")), max_size=30), min_size=1)
)
def test_any_digit_text_equals_the_batch_call(tok, encoder, texts):
    assert encoder.encode(texts, False) == batch_ids(tok, texts)
