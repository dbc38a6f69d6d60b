"""`/v1/responses` bodies (the Responses API), their text subset: `instructions` and `input`
become chat messages, rendered by the same chat template as a `/v1/chat/completions` line, and
the sampling fields are read under the names chat's parsing knows. No torch here.
"""

from __future__ import annotations

from typing import Any

from jobrunner.prep.render import RenderError, content_text
from jobrunner.structured.spec import OutputSpec, SpecError, text_format_spec

ROLES = ("user", "assistant", "system", "developer")
# Content parts that carry text, as chat's part type (content_text reads `text` and `refusal`).
TEXT_PARTS = {"input_text": "text", "output_text": "text", "refusal": "refusal"}
LOGPROBS = "message.output_text.logprobs"
# `include` entries that ask for nothing a text answer lacks (there is no reasoning to encrypt).
INCLUDED = {LOGPROBS, "reasoning.encrypted_content"}

# Fields whose values change the answer and cannot be honoured: (allowed values, why).
UNSUPPORTED: dict[str, tuple[tuple[Any, ...], str]] = {
    "stream": ((None, False), "streaming is not supported yet"),
    "previous_response_id": (
        (None,),
        "stored responses cannot be read offline: send the whole conversation in body.input",
    ),
    "conversation": (
        (None,),
        "stored conversations cannot be read offline: send the whole conversation in body.input",
    ),
    "prompt": ((None,), "stored prompt templates cannot be read offline: send body.input"),
    "tools": ((None, []), "tools are not supported on /v1/responses yet (use chat)"),
    "tool_choice": ((None, "none", "auto"), "tools are not supported on /v1/responses yet"),
}
HONOURED = {
    "model",
    "input",
    "instructions",
    "max_output_tokens",
    "temperature",
    "top_p",
    "top_logprobs",
    "include",
    "seed",  # not an OpenAI field; chat's, honoured as it is there
    "text",
    "parallel_tool_calls",  # no tools, no calls
}
# Any other body field (store, metadata, user, reasoning, truncation, ...) is ignored, with one
# warning, as chat's are.


def check_fields(body: dict[str, Any]) -> None:
    """Raise `unsupported` for a field whose value cannot be honoured."""
    for key, (allowed, why) in UNSUPPORTED.items():
        if key in body and body[key] not in allowed:
            raise RenderError("unsupported", f"body.{key}={body[key]!r}: {why}", f"body.{key}")
    include = body.get("include") or []
    if not isinstance(include, list):
        raise RenderError("bad_body", "body.include must be a list of strings", "body.include")
    for i, entry in enumerate(include):
        if entry not in INCLUDED:
            raise RenderError(
                "unsupported",
                f"body.include[{i}]={entry!r} is not supported (only {LOGPROBS!r})",
                f"body.include[{i}]",
            )


def sampling_fields(body: dict[str, Any], max_new: int | None) -> dict[str, Any]:
    """The body's sampling fields under chat's names (`max_new` is body.max_output_tokens,
    checked under its own name). Logprobs are on when `include` asks for them or top_logprobs
    is given."""
    top = body.get("top_logprobs")
    wanted = LOGPROBS in (body.get("include") or []) or bool(top)
    fields = {
        "max_completion_tokens": max_new,
        "temperature": body.get("temperature"),
        "top_p": body.get("top_p"),
        "seed": body.get("seed"),
        "logprobs": True if wanted else None,
        "top_logprobs": top,
    }
    return {k: v for k, v in fields.items() if v is not None}


def text_spec(body: dict[str, Any]) -> OutputSpec | None:
    """The structured output `body.text.format` asks for (None for plain text)."""
    text = body.get("text")
    if text is None:
        return None
    if not isinstance(text, dict):
        raise RenderError("bad_body", "body.text must be an object {format: ...}", "body.text")
    try:
        return text_format_spec(text.get("format"), "body.text.format")
    except SpecError as e:
        raise RenderError(e.code, str(e), e.field) from e


def messages(body: dict[str, Any]) -> list[dict[str, str]]:
    """`instructions` (a system message, first) and `input` (a string: one user message; or a
    list of message items) as chat messages; developer turns are system turns, as in chat."""
    out = []
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise RenderError("bad_body", "body.instructions must be a string", "body.instructions")
    if instructions:
        out.append({"role": "system", "content": instructions})
    items = body.get("input")
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        what = "needs input" if items is None else "input must be"
        raise RenderError(
            "bad_body",
            f"a response body {what} a string or a non-empty list of input items",
            "body.input",
        )
    out += [_message(item, f"body.input[{i}]") for i, item in enumerate(items)]
    if not any(m["content"].strip() for m in out):
        raise RenderError("empty_prompt", "body.input is empty", "body.input")
    return [{**m, "role": "system"} if m["role"] == "developer" else m for m in out]


def _message(item: Any, where: str) -> dict[str, str]:
    if not isinstance(item, dict):
        raise RenderError("bad_body", f"{where} must be an input item (an object)", where)
    kind = item.get("type", "message")
    if kind != "message":
        raise RenderError(
            "unsupported",
            f"{where} is a {kind!r} item: only message items are supported (turns are rendered"
            " as text); send it as text, or remove it",
            f"{where}.type",
        )
    role = item.get("role")
    if role not in ROLES:
        raise RenderError(
            "bad_body",
            f"{where}.role must be one of {', '.join(ROLES)}, got {role!r}",
            f"{where}.role",
        )
    content = item.get("content")
    if isinstance(content, list):
        content = content_text([_chat_part(p) for p in content], f"{where}.content")
    if not isinstance(content, str):
        raise RenderError(
            "bad_body",
            f"{where}.content must be a string or a list of input_text parts",
            f"{where}.content",
        )
    return {"role": role, "content": content}


def _chat_part(part: Any) -> Any:
    """A Responses content part as chat's: input_text/output_text are chat's text parts; any
    other (input_image, input_file, input_audio) stays as is, for content_text to refuse."""
    kind = part.get("type") if isinstance(part, dict) else None
    return {**part, "type": TEXT_PARTS[kind]} if kind in TEXT_PARTS else part
