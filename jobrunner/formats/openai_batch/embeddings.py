"""OpenAI `/v1/embeddings` batch lines: their preparer (embed jobs) and their output bodies.

A line's `input` is a string, a list of strings, a list of token ids, or a list of token-id
lists. A string or one token-id list is one row keyed by the line's custom_id; a list of inputs
is one row per input, keyed `<custom_id>#<index>`, with the columns custom_id, input_index and
input_count. output.jsonl puts a line's rows back together, data in index order, as one
CreateEmbeddingResponse (`EmbeddingLines`). A line is checked as a whole, as the API does: an
empty input, one too long (under input.on_too_long: error), more than 2,048 inputs, a token
id outside the vocabulary or `dimensions` wider than the model's vectors fails the whole line,
with one error. A line whose row failed while
running (out of memory) has that row's error in errors.jsonl and no output line. No torch here.
"""

from __future__ import annotations

import base64
import struct
from dataclasses import dataclass
from typing import Any

from jobrunner.engine.embed.st_files import vector_width
from jobrunner.formats.openai_batch.custom_ids import duplicate_line
from jobrunner.formats.openai_batch.prepare import OpenAIPreparer
from jobrunner.formats.openai_batch.read import BatchLineError, body_object, check_method
from jobrunner.prep.embed import EMBED_SAMPLING, fit_tokens, max_input_tokens, special_span
from jobrunner.prep.render import RenderError
from jobrunner.types import Request, RowError

EMBEDDINGS = "/v1/embeddings"
MAX_INPUTS = 2048  # inputs per /v1/embeddings request, as the API allows
ENCODINGS = ("float", "base64")


# ---------------------------------------------------------------------- preparing


@dataclass
class EmbedLine:
    inputs: list[Any]  # strings, then token-id lists once tokenized
    single: bool  # `input` was one string or one token-id list: the row keeps the custom_id
    encoding_format: str
    dimensions: int | None
    texts: list[str]


class OpenAIEmbedPreparer(OpenAIPreparer):
    """`input.format: openai-batch` in an embed job: every line must be a /v1/embeddings one."""

    def __init__(self, cfg, tokenizer) -> None:
        super().__init__(cfg, tokenizer)
        self.limit = max_input_tokens(cfg, tokenizer)
        self.span = special_span(tokenizer)  # texts get the tokenizer's special tokens
        where = getattr(tokenizer, "name_or_path", "") or ""
        self.width = vector_width(where) if where else None  # None: the engine checks it

    def row_id(self, raw) -> str | RowError:
        """The custom_id, as OpenAIPreparer checks it; a line whose inputs' ids
        (`<custom_id>#<index>`) another line already uses, as its custom_id or as one of its
        inputs' ids, is a per-line error like a repeated custom_id."""
        cid = super().row_id(raw)
        if not isinstance(cid, str):
            return cid
        ids = self.result_ids(cid, raw)[1:]
        if taken := [i for i in ids if i in self._seen]:
            why = (
                f"{taken[0]!r}, the id of one of this line's inputs, is used by an earlier line,"
                f" {self._seen.where(taken[0])}; rename one of the two custom_ids"
            )
            return duplicate_line(raw, cid, why)
        self._seen.add(ids, *self._line_of(raw))
        return cid

    def result_ids(self, row_id: str, raw) -> list[str]:
        """A line of several inputs ends as `<custom_id>#<index>` rows (or, failed, as its
        custom_id): resume checks committed ids against these."""
        body = raw.values.get("body")
        inputs = body.get("input") if isinstance(body, dict) else None
        if not isinstance(inputs, list) or not inputs or _is_ids(inputs):
            return [row_id]
        return [row_id, *(f"{row_id}#{i}" for i in range(min(len(inputs), MAX_INPUTS)))]

    def prepare_batch(self, items: list) -> list[Request | RowError]:
        parsed: list[Any] = [
            self._per_row(i, lambda raw: parse_embed_line(raw.values)) for i in items
        ]
        texts = [t for p in parsed if isinstance(p, tuple) for t in p[2].texts]
        encoded = iter(self.tokenizer(texts)["input_ids"] if texts else [])
        out: list[Request | RowError] = []
        for p in parsed:
            if not isinstance(p, tuple):
                out.append(p)
                continue
            row_id, raw, line = p
            line.inputs = [list(next(encoded)) if isinstance(x, str) else x for x in line.inputs]
            out.extend(self._line_requests(row_id, raw, line))
        return out

    def _line_requests(self, cid: str, raw, line: EmbedLine) -> list[Request | RowError]:
        code, field, why = self._check(line)
        if code:
            msg = f"{raw.source}: {why}"
            return [BatchLineError(code, msg, raw.source, cid, field, custom_id=cid)]
        reqs = []
        for i, ids in enumerate(line.inputs):
            row_id = cid if line.single else f"{cid}#{i}"
            text = line.texts[i] if len(line.texts) == len(line.inputs) else ""
            req = Request(row_id, ids, EMBED_SAMPLING, raw.source, text)
            req.columns = {
                "url": EMBEDDINGS,
                "custom_id": cid,
                "input_index": i,
                "input_count": len(line.inputs),
                "encoding_format": line.encoding_format,
            }
            req.meta = {"embed": True, "custom_id": cid, "dimensions": line.dimensions}
            reqs.append(req)
        return reqs

    def _check(self, line: EmbedLine) -> tuple[str | None, str, str]:
        """(error code, field, message) of the line's first problem, or (None, "", ""): a
        `dimensions` wider than the model's vectors fails the line here, once, as the API
        fails a request, not each of its inputs' rows in the engine."""
        if line.dimensions and self.width and line.dimensions > self.width:
            why = f"body.dimensions is {line.dimensions}; the model's vectors have {self.width}"
            return "bad_body", "body.dimensions", why
        vocab = len(self.tokenizer)
        for i, ids in enumerate(line.inputs):
            where = "body.input" if line.single else f"body.input[{i}]"
            if any(t >= vocab for t in ids):
                why = f"{where} holds token ids outside the vocabulary (size {vocab})"
                return "bad_body", "body.input", why
            span = self.span if line.texts else (0, 0)  # token ids are embedded as given
            fitted = fit_tokens(ids, self.limit, self.cfg.input.on_too_long, span)
            if isinstance(fitted, str):
                return "too_long", "body.input", f"{where}: {fitted}"
            line.inputs[i] = fitted
        return None, "", ""


def parse_embed_line(values: dict[str, Any]) -> EmbedLine:
    """Validate one /v1/embeddings line. Raises RenderError(code, message, field)."""
    check_method(values)
    if values.get("url") != EMBEDDINGS:
        raise RenderError(
            "unknown_endpoint",
            f"url {values.get('url')!r}: an embed job (task: embed) answers {EMBEDDINGS} only",
            "url",
        )
    body = body_object(values)
    fmt = body.get("encoding_format") or "float"
    if fmt not in ENCODINGS:
        raise RenderError(
            "bad_body",
            f"body.encoding_format must be float or base64, got {fmt!r}",
            "body.encoding_format",
        )
    dims = body.get("dimensions")
    if dims is not None and (isinstance(dims, bool) or not isinstance(dims, int) or dims < 1):
        raise RenderError(
            "bad_body", f"body.dimensions must be an integer >= 1, got {dims!r}", "body.dimensions"
        )
    inputs, single = _inputs(body.get("input"))
    texts = [x for x in inputs if isinstance(x, str)]
    return EmbedLine(inputs, single, fmt, dims, texts)


def _is_ids(x: Any) -> bool:
    return isinstance(x, list) and all(
        isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in x
    )


def _inputs(v: Any) -> tuple[list[Any], bool]:
    if isinstance(v, str):
        if not v.strip():
            raise RenderError("empty_input", "body.input is an empty string", "body.input")
        return [v], True
    if isinstance(v, list) and v and _is_ids(v):
        return [list(v)], True
    if not isinstance(v, list) or not v:
        raise RenderError(
            "bad_body",
            "body.input must be a string, a list of strings, a list of token ids or a list of"
            " token-id lists (non-empty)",
            "body.input",
        )
    if len(v) > MAX_INPUTS:
        raise RenderError(
            "too_many_inputs",
            f"body.input holds {len(v)} inputs; at most {MAX_INPUTS} per request",
            "body.input",
        )
    for i, x in enumerate(v):
        if isinstance(x, str):
            if not x.strip():
                raise RenderError(
                    "empty_input", f"body.input[{i}] is an empty string", "body.input"
                )
        elif not (_is_ids(x) and x):
            raise RenderError(
                "bad_body",
                f"body.input[{i}] must be a non-empty string or a non-empty list of token ids",
                "body.input",
            )
    if len({isinstance(x, str) for x in v}) > 1:
        raise RenderError("bad_body", "body.input mixes strings and token-id lists", "body.input")
    return list(v), False


# ---------------------------------------------------------------------- output


def encode_vector(v: list[float], encoding_format: str) -> list[float] | str:
    """`base64`: the float32 little-endian bytes, base64-encoded (what the API sends)."""
    if encoding_format != "base64":
        return v
    return base64.b64encode(struct.pack(f"<{len(v)}f", *v)).decode("ascii")


def embedding_body(recs: list[dict[str, Any]]) -> dict[str, Any]:
    """A CreateEmbeddingResponse for one line's rows (sorted by input_index)."""
    tokens = sum(r["prompt_tokens"] for r in recs)
    return {
        "object": "list",
        "data": [
            {
                "object": "embedding",
                "index": r["input_index"],
                "embedding": encode_vector(r["embedding"], r.get("encoding_format") or "float"),
            }
            for r in recs
        ],
        "model": recs[0]["model"],
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


class EmbeddingLines:
    """Collects embedding rows by custom_id; `add` returns a line's rows once it is complete."""

    def __init__(self) -> None:
        self._open: dict[str, list[dict[str, Any]]] = {}

    def add(self, rec: dict[str, Any]) -> list[dict[str, Any]] | None:
        cid = rec["custom_id"]
        rows = self._open.setdefault(cid, [])
        rows.append(rec)
        if len(rows) < rec["input_count"]:
            return None
        del self._open[cid]
        return sorted(rows, key=lambda r: r["input_index"])

    @property
    def incomplete(self) -> int:
        """Lines some of whose rows failed: they have no output line."""
        return len(self._open)
