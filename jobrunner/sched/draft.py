"""Draft tokens for speculative decoding by n-gram lookup in the sequence's own tokens.

If the last few tokens occurred earlier in the prompt or the output, the tokens that followed
them then are proposed as the next ones (prompt lookup: summaries quote their text, small
models repeat themselves). The model checks all of them in one step: greedy rows keep the
drafts up to the first one that differs from the model's own choice, plus that choice, so the
output is the same as without drafts, in fewer steps.
"""

from __future__ import annotations

NGRAM_SIZES = (3, 2)  # the longest match is tried first


class NgramDrafter:
    """Where each n-gram of a sequence's tokens last ended, kept up to date as tokens grow."""

    def __init__(self) -> None:
        self.last_end: dict[tuple[int, ...], int] = {}
        self.indexed = 0  # n-grams ending before this position are in last_end

    def propose(self, tokens: list[int], k: int) -> list[int]:
        """Up to k tokens that followed the latest earlier occurrence of the sequence's tail."""
        if k <= 0:
            return []
        self._index(tokens, len(tokens) - 1)  # everything but the tail itself
        for n in NGRAM_SIZES:
            end = self.last_end.get(tuple(tokens[-n:])) if len(tokens) > n else None
            if end is not None:
                return tokens[end + 1 : end + 1 + k]
        return []

    def _index(self, tokens: list[int], stop: int) -> None:
        for end in range(self.indexed, stop):
            for n in NGRAM_SIZES:
                if end + 1 >= n:
                    self.last_end[tuple(tokens[end + 1 - n : end + 1])] = end
        self.indexed = max(self.indexed, stop)


def accept(draft: list[int], choices: list[int]) -> list[int]:
    """The tokens a row keeps: the model's choice at its last known token and at each draft
    token (`choices`, 1 + len(draft) of them), up to and including the first choice that
    differs from the draft token it was checked against."""
    a = 0
    while a < len(draft) and choices[a] == draft[a]:
        a += 1
    return choices[: a + 1]
