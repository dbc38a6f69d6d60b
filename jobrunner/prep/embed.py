"""`task: embed` rows -> Requests: a text column or a template, never a chat template; the
tokenizer adds its special tokens (BERT's [CLS] ... [SEP]). No torch here.

An input longer than `max_input_tokens` fails its row, or is cut (input.on_too_long). OpenAI
/v1/embeddings lines have their own preparer (formats/openai_batch/embeddings.py).
"""

from __future__ import annotations

from typing import Any

from jobrunner.engine.embed.st_files import st_max_seq_length
from jobrunner.prep.prepare import Preparer
from jobrunner.prep.render import PromptRenderer
from jobrunner.types import Request, RowError, SamplingParams

EMBED_SAMPLING = SamplingParams(max_new_tokens=0)  # nothing is generated; greedy: dedup applies


def max_input_tokens(cfg: Any, tokenizer: Any) -> int:
    """Tokens one input may hold: model.max_model_len, bounded by the sentence-transformers
    max_seq_length and the tokenizer's model_max_length where the model states them."""
    limits = [cfg.model.max_model_len]
    where = getattr(tokenizer, "name_or_path", "") or ""
    st = st_max_seq_length(where) if where else None
    if st:
        limits.append(st)
    tok_max = getattr(tokenizer, "model_max_length", None)
    if isinstance(tok_max, int) and 0 < tok_max < 1 << 20:
        limits.append(tok_max)
    return min(limits)


class EmbedPreparer(Preparer):
    """A text column or template; special tokens as the tokenizer adds them (CLS/SEP)."""

    def __init__(self, cfg, tokenizer) -> None:
        super().__init__(cfg, tokenizer)
        self.renderer = PromptRenderer(
            cfg.input.model_copy(update={"use_chat_template": False}), tokenizer
        )
        self.sampling = EMBED_SAMPLING
        self.limit = max_input_tokens(cfg, tokenizer)
        self.span = special_span(tokenizer) if self.renderer.adds_special_tokens else (0, 0)

    def _request(self, row_id, raw, text, ids, sampling=None) -> Request | RowError:
        ids = fit_tokens(ids, self.limit, self.cfg.input.on_too_long, self.span)
        if isinstance(ids, str):
            field = self.cfg.input.prompt.column
            return RowError("too_long", f"{raw.source}: {ids}", raw.source, row_id, field)
        req = Request(row_id, ids, EMBED_SAMPLING, raw.source, text, self._priority(raw))
        req.columns = self._columns(raw)
        req.meta = {"embed": True}
        return req


def special_span(tokenizer: Any) -> tuple[int, int]:
    """How many special tokens the tokenizer puts before and after a text (BERT: [CLS] and
    [SEP], 1 and 1; SmolLM2: 0 and 0): a cut input keeps them, as the model saw in training."""
    if tokenizer is None:  # the id scan builds preparers without a tokenizer
        return 0, 0
    marked = list(tokenizer("a")["input_ids"])
    plain = list(tokenizer("a", add_special_tokens=False)["input_ids"])
    for head in range(len(marked) - len(plain) + 1):
        if plain and marked[head : head + len(plain)] == plain:
            return head, len(marked) - head - len(plain)
    return 0, 0


def fit_tokens(
    ids: list[int], limit: int, policy: str, span: tuple[int, int] = (0, 0)
) -> list[int] | str:
    """The ids within `limit` (cut as input.on_too_long says, keeping the `span` of special
    tokens at each end), or the error's message."""
    if len(ids) <= limit:
        return ids
    if policy == "error":
        return (
            f"the input has {len(ids)} tokens; this model embeds at most {limit} (set"
            " input.on_too_long to truncate_right or truncate_left to cut it)"
        )
    head, tail = span
    if head + tail >= limit or head + tail >= len(ids):
        head = tail = 0
    body = ids[head : len(ids) - tail]
    room = limit - head - tail
    body = body[-room:] if policy == "truncate_left" else body[:room]
    return ids[:head] + body + ids[len(ids) - tail :]
