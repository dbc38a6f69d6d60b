"""Stop strings found on incremental text, with the real tokenizer."""

from __future__ import annotations

from types import SimpleNamespace

from jobrunner.engine.paged.detok import _StopWatch
from jobrunner.types import Request, SamplingParams

TEXT = (
    "Première étape : mélanger 200 g de farine — puis 日本語のテキスト 😀 and plain ASCII words, "
    "repeated so the output is long. " * 12
)


class CountingTokenizer:
    def __init__(self, tokenizer):
        self.tokenizer, self.decoded = tokenizer, 0

    def decode(self, ids, **kw):
        self.decoded += len(ids)
        return self.tokenizer.decode(ids, **kw)


def _watch(stop):
    seq = SimpleNamespace(request=Request("r", [1], SamplingParams(stop=(stop,))))
    return _StopWatch(seq)


def test_stop_is_found_where_a_full_decode_finds_it_in_linear_work(tokenizer):
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    full = tokenizer.decode(ids, skip_special_tokens=True)
    stop = "ASCII words, repeated so the output is long. Premi"  # spans many tokens, second round
    counting = CountingTokenizer(tokenizer)
    watch = _watch(stop)
    n, hit = 0, -1
    while hit < 0 and n < len(ids):
        n += 1
        text, hit = watch.feed(counting, ids[n - 1])
    assert hit >= 0 and text[:hit] == full[: full.index(stop)]
    assert text == tokenizer.decode(ids[:n], skip_special_tokens=True)
    assert counting.decoded < 8 * n + len(ids)  # windows plus one full decode, not n^2 / 2


def test_incremental_text_equals_the_full_decode_without_a_stop(tokenizer):
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    watch = _watch("never in the text")
    for token in ids:
        _text, hit = watch.feed(tokenizer, token)
        assert hit < 0
    assert watch.text == tokenizer.decode(ids, skip_special_tokens=True)
