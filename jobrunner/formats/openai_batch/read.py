"""OpenAI Batch API input files: JSONL lines `{"custom_id", "method", "url", "body"}`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from jobrunner.formats.jsonl import parse_json_line
from jobrunner.formats.lines import read_lines
from jobrunner.io.compressed import open_input
from jobrunner.io.readers import Item, ReadOptions
from jobrunner.prep.prepare import derived_id
from jobrunner.prep.render import RenderError
from jobrunner.types import RowError, RowRef, kind_of

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
RESPONSES = "/v1/responses"
# Azure OpenAI's batch files name the endpoints without the version prefix.
ALIASES = {
    CHAT: CHAT,
    COMPLETIONS: COMPLETIONS,
    RESPONSES: RESPONSES,
    "/chat/completions": CHAT,
    "/completions": COMPLETIONS,
}


@dataclass
class BatchLineError(RowError):
    """A per-line error that knows the line's custom_id (None when the line has none)."""

    custom_id: str | None = None


def endpoint(url: Any) -> str | None:
    """The endpoint a line's url names (CHAT, COMPLETIONS or RESPONSES), or None."""
    return ALIASES.get(url) if isinstance(url, str) else None


def check_method(values: dict[str, Any]) -> None:
    """A batch line is a POST (the API's only method for its endpoints)."""
    method = values.get("method", "POST")
    if method != "POST":
        raise RenderError("bad_method", f"method must be POST, got {method!r}", "method")


def body_object(values: dict[str, Any]) -> dict[str, Any]:
    """The line's body, which must be a JSON object."""
    body = values.get("body")
    if not isinstance(body, dict):
        raise RenderError("bad_body", f"body must be a JSON object, got {kind_of(body)}", "body")
    return body


def read_openai_batch(
    file: str, batch_rows: int, options: ReadOptions = ReadOptions()
) -> Iterator[Item]:
    return read_lines(file, parse_batch_line)


def parse_batch_line(raw: bytes, ref: RowRef) -> Item:
    """A JSONL line; an unreadable one gets its derived id so a rerun does not redo it, and
    keeps its custom_id where the JSON holds one (a lone surrogate in its body), so its error
    line joins on it."""
    item = parse_json_line(raw, ref)
    if isinstance(item, RowError):
        return BatchLineError(
            item.code,
            item.message,
            item.source,
            derived_id(item.source),
            item.field,
            custom_id=readable_custom_id(raw),
        )
    return item


def readable_custom_id(raw: bytes) -> str | None:
    """The custom_id of a refused line whose JSON parses, when it is a non-empty string that
    is text itself; else None (the error line is then named by the line's derived id)."""
    try:
        values = json.loads(raw)
        cid = values.get("custom_id") if isinstance(values, dict) else None
        if isinstance(cid, str) and cid.strip() and cid.encode("utf-8"):
            return cid
    except (ValueError, RecursionError):  # not JSON, nested past the limit, a lone surrogate
        pass
    return None


def claims(file: str, kind: str) -> bool:
    """`input.format: auto`: a .jsonl file whose first line has custom_id, url and body."""
    if kind != "jsonl":
        return False
    with open_input(file) as f:
        for raw in f:
            if raw.strip():
                try:
                    first = json.loads(raw)
                except (ValueError, RecursionError):  # not JSON, or nested past the limit
                    return False
                return isinstance(first, dict) and {"custom_id", "body", "url"} <= first.keys()
    return False
