"""OpenAI Batch API lines -> Requests: `{"custom_id", "method", "url", "body"}` per line.

`/v1/chat/completions` bodies go through the model's chat template, and so do `/v1/responses`
bodies (their instructions and input as chat messages, responses.py); `/v1/completions` prompts
are used as raw text (no template). Each line carries its own sampling parameters; a field the body
omits takes the job's `generation:` value. Every line ends as one Request or one RowError naming
its line: unknown endpoints, bad bodies, unsupported options and repeated custom_ids are per-line
errors, never a job failure. No torch here.
"""

from __future__ import annotations

import logging
from typing import Any

from jobrunner.formats.openai_batch import responses
from jobrunner.formats.openai_batch.body import HONOURED, UNSUPPORTED, Line, parse_line
from jobrunner.formats.openai_batch.custom_ids import FirstLines, duplicate_line
from jobrunner.formats.openai_batch.read import CHAT, COMPLETIONS, RESPONSES, BatchLineError
from jobrunner.prep.prepare import Preparer, derived_id, place_name
from jobrunner.types import Request, RowError

log = logging.getLogger(__name__)

SEED_MASK = (1 << 63) - 1

# The field a line's prompt came from (a too-long prompt's error names it).
PROMPT_FIELDS = {CHAT: "body.messages", RESPONSES: "body.input", COMPLETIONS: "body.prompt"}


class OpenAIPreparer(Preparer):
    """`input.format: openai-batch`. Stateful: the first line with a custom_id owns it."""

    def __init__(self, cfg, tokenizer) -> None:
        super().__init__(cfg, tokenizer)
        self._seen = FirstLines()
        self._warned: set[str] = set()

    def row_id(self, raw) -> str | RowError:
        """The custom_id; a repeated one gets the line's derived id and a per-line error."""
        cid = raw.values.get("custom_id")
        if not isinstance(cid, str) or not cid.strip():
            what = "missing" if cid is None else f"not a non-empty string ({type(cid).__name__})"
            return BatchLineError(
                "missing_custom_id",
                f"{raw.source}: custom_id is {what}",
                raw.source,
                derived_id(raw.source),
                "custom_id",
            )
        first = self._seen.take(cid, *self._line_of(raw))
        if first is not None:
            why = (
                f"custom_id {cid!r} is used by an earlier line, {first} (custom_ids must be unique)"
            )
            return duplicate_line(raw, cid, why)
        return cid

    def _line_of(self, raw) -> tuple[str, int]:
        """`raw`'s line as FirstLines keeps it: its file named relative to the input root."""
        return place_name(raw.source.file, self._root), raw.source.line or 0

    def prepare_batch(self, items: list) -> list[Request | RowError]:
        out: list[Any] = [self._parse(i) for i in items]
        for special in (False, True):  # templated chat text already holds its special tokens
            todo = [
                k
                for k, o in enumerate(out)
                if isinstance(o, tuple)
                and o[2].token_ids is None
                and (o[2].endpoint == COMPLETIONS) == special
            ]
            if todo:
                texts = [out[k][2].text for k in todo]
                for k, ids in zip(todo, self.encode_texts(texts, special), strict=True):
                    out[k][2].token_ids = ids
        return [self._line_request(*o) if isinstance(o, tuple) else o for o in out]

    # ------------------------------------------------------------------ per line

    def _parse(self, item) -> RowError | tuple[str, Any, Line]:
        return self._per_row(item, self._parse_line)

    def _parse_line(self, raw) -> Line:
        line = parse_line(raw.values, self.sampling, self.renderer.chat)
        self._warn_once(raw, line)
        return line

    def _line_request(self, row_id: str, raw, line: Line) -> Request | RowError:
        vocab = len(self.tokenizer)
        if any(t >= vocab for t in line.token_ids):
            return RowError(
                "bad_body",
                f"{raw.source}: body.prompt holds token ids outside the"
                f" model's vocabulary (size {vocab})",
                raw.source,
                row_id,
                "body.prompt",
            )
        field = PROMPT_FIELDS[line.endpoint]
        req = self._request(row_id, raw, line.text, line.token_ids, line.sampling, field)
        if isinstance(req, Request):
            if line.seed is not None:  # OpenAI's seed: same seed and prompt, same sample
                req.seq_seed = line.seed & SEED_MASK
            req.meta = {"endpoint": line.endpoint, "custom_id": row_id, "model": line.model}
            spec = line.sampling.structured
            req.columns["tool_call"] = spec.tool if spec else None  # output: message.tool_calls
        return req

    def _columns(self, raw) -> dict[str, Any]:
        """`url` always (the output's shape depends on it); method and body as input columns."""
        keep = ("method", "url", "body") if self.cfg.output.keep_input_columns else ("url",)
        return {k: raw.values.get(k) for k in keep}

    def _warn_once(self, raw, line: Line) -> None:
        body = raw.values.get("body") or {}
        if line.model and line.model != self.cfg.model.source and "model" not in self._warned:
            self._warned.add("model")
            log.warning(
                "%s: body.model %r differs from the job's model %r; every line runs on"
                " the job's model",
                raw.source,
                line.model,
                self.cfg.model.source,
            )
        known = (
            responses.HONOURED | set(responses.UNSUPPORTED)
            if line.endpoint == RESPONSES
            else HONOURED | set(UNSUPPORTED)
        )
        for key in sorted(set(body) - known - self._warned):
            self._warned.add(key)
            log.warning("%s: body.%s is not used (warned once)", raw.source, key)
