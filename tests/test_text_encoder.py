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
