"""An OpenAI batch line's body, validated into a `Line`: its endpoint, its prompt (a
`/v1/chat/completions` body's messages and a `/v1/responses` body's input through the chat
template, a `/v1/completions` prompt as raw text or token ids), its sampling parameters (a field
the body omits takes the job's `generation:` value) and its structured output. A bad body raises
RenderError(code, message, field), the line's error. No torch here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from jobrunner.formats.openai_batch import responses
from jobrunner.formats.openai_batch.read import (
    CHAT,
    COMPLETIONS,
    RESPONSES,
    body_object,
    check_method,
    endpoint,
)
from jobrunner.prep.render import RenderError, validate_messages
from jobrunner.structured.spec import OutputSpec, SpecError, response_format_spec, tool_spec
from jobrunner.types import SamplingParams

# Options that change what a response holds; rejected per line until supported (null, false and
# the defaults shown are accepted).
UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "best_of": (None, 1),
    "echo": (None, False),
    "suffix": (None, ""),
    "stream": (None, False),
    "functions": (None, []),
    "function_call": (None, "none", "auto"),
    "audio": (None,),
    "prediction": (None,),
}
HONOURED = {
    "model",
    "messages",
    "prompt",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "stop",
    "seed",
    "response_format",
    "tools",
    "tool_choice",
    "parallel_tool_calls",  # one call is an answer either way
    "n",
    "logprobs",
    "top_logprobs",
    "logit_bias",
    "presence_penalty",
    "frequency_penalty",
    # vLLM's extra sampling fields
    "top_k",
    "min_p",
    "repetition_penalty",
    "min_tokens",
    "stop_token_ids",
}
# Any other body field (user, metadata, store, service_tier, ...) is ignored, with one warning.


@dataclass
class Line:
    """A validated batch line, before tokenization."""

    endpoint: str
    text: str  # chat: templated text; completions: the raw prompt
    sampling: SamplingParams
    seed: int | None  # the body's seed, if any
    model: str | None
    token_ids: list[int] | None = None  # a completions prompt given as token ids


def parse_line(values: dict[str, Any], defaults: SamplingParams, chat: Callable[..., str]) -> Line:
    """Validate one line and render its prompt. Raises RenderError(code, message, field)."""
    check_method(values)
    url = endpoint(values.get("url"))
    if url is None:
        raise RenderError(
            "unknown_endpoint",
            f"url {values.get('url')!r} is not supported (use {CHAT}, {RESPONSES} or {COMPLETIONS})",
            "url",
        )
    body = body_object(values)
    if url == RESPONSES:
        return responses_line(body, defaults, chat)
    check_unsupported(body)
    model = _model(body)
    sampling, seed = parse_sampling(body, defaults)
    spec = body_spec(body, url)
    if spec is not None:
        sampling = replace(sampling, structured=spec)
    if url == CHAT:
        tools = {"tools": body["tools"]} if spec is not None and spec.tool is not None else {}
        return Line(
            url, chat(_messages(body), where="body.messages", **tools), sampling, seed, model
        )
    text, ids = _prompt(body)
    return Line(url, text, sampling, seed, model, ids)


def responses_line(
    body: dict[str, Any], defaults: SamplingParams, chat: Callable[..., str]
) -> Line:
    """A /v1/responses body as chat's would be read: its messages through the chat template,
    one answer (the API has no `n`), text.format as the response_format."""
    responses.check_fields(body)
    model = _model(body)
    max_new = _number(body, "max_output_tokens", int, 1)
    sampling, seed = parse_sampling(responses.sampling_fields(body, max_new), defaults)
    spec = responses.text_spec(body)
    sampling = replace(sampling, n=1, **({"structured": spec} if spec is not None else {}))
    return Line(RESPONSES, chat(responses.messages(body)), sampling, seed, model)


def _model(body: dict[str, Any]) -> str | None:
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise RenderError("bad_body", "body.model must be a string", "body.model")
    return model


def body_spec(body: dict[str, Any], url: str) -> OutputSpec | None:
    """The line's structured output: a forced tool call, else its response_format."""
    try:
        if url == CHAT:
            tool = tool_spec(body.get("tools"), body.get("tool_choice"), "body")
            if tool is not None:
                return tool
        elif body.get("tools") not in (None, []):
            raise SpecError("body.tools needs the chat endpoint", "body.tools", "unsupported")
        return response_format_spec(body.get("response_format"), "body.response_format")
    except SpecError as e:
        raise RenderError(e.code, str(e), e.field) from e


def check_unsupported(body: dict[str, Any]) -> None:
    for key, allowed in UNSUPPORTED.items():
        if key in body and body[key] not in allowed:
            raise RenderError(
                "unsupported",
                f"body.{key}={body[key]!r} is not supported yet"
                " (remove it, or leave it at its default)",
                f"body.{key}",
            )


def parse_sampling(body: dict[str, Any], d: SamplingParams) -> tuple[SamplingParams, int | None]:
    """The body's sampling fields over the job's defaults, and its seed (if any)."""
    max_new = _number(body, "max_completion_tokens", int, 1)
    if max_new is None:
        max_new = _number(body, "max_tokens", int, 1)
    top_p = _number(body, "top_p", float, 0.0, 1.0)
    if top_p == 0.0:
        raise RenderError("bad_body", "body.top_p must be > 0", "body.top_p")
    top_k = _number(body, "top_k", int, -1)
    seed = _number(body, "seed", int)
    given = {
        "max_new_tokens": max_new,
        "temperature": _number(body, "temperature", float, 0.0, 2.0),
        "top_p": top_p,
        "top_k": None if top_k is None else max(top_k, 0),  # vLLM: -1 turns top-k off
        "min_p": _number(body, "min_p", float, 0.0, 1.0),
        "seed": seed,
        "stop": _stop(body.get("stop")),
        "n": _number(body, "n", int, 1, 128),
        "presence_penalty": _number(body, "presence_penalty", float, -2.0, 2.0),
        "frequency_penalty": _number(body, "frequency_penalty", float, -2.0, 2.0),
        "repetition_penalty": _number(body, "repetition_penalty", float, 0.0),
        "min_tokens": _number(body, "min_tokens", int, 0),
        "logit_bias": _logit_bias(body.get("logit_bias")),
        "stop_token_ids": _token_ids(body.get("stop_token_ids"), "stop_token_ids"),
        **_logprobs(body),
    }
    if given["repetition_penalty"] == 0.0:
        raise RenderError(
            "bad_body", "body.repetition_penalty must be > 0", "body.repetition_penalty"
        )
    return replace(d, **{k: v for k, v in given.items() if v is not None}), seed


def _logprobs(body: dict[str, Any]) -> dict[str, Any]:
    """Chat: `logprobs: bool` and `top_logprobs: 0..20`; completions: `logprobs: 0..20`, the
    number of alternatives (OpenAI's legacy field)."""
    v = body.get("logprobs")
    if isinstance(v, bool) or v is None:
        top = _number(body, "top_logprobs", int, 0, 20)
        if top and not v:
            raise RenderError(
                "bad_body", "body.top_logprobs needs body.logprobs: true", "body.top_logprobs"
            )
        return {"logprobs": v, "top_logprobs": top}
    return {"logprobs": True, "top_logprobs": _number(body, "logprobs", int, 0, 20)}


def _logit_bias(v: Any) -> tuple[tuple[int, float], ...] | None:
    if v is None:
        return None
    msg = "body.logit_bias must map token ids to numbers in [-100, 100]"
    if not isinstance(v, dict):
        raise RenderError("bad_body", msg, "body.logit_bias")
    out = []
    for k, b in v.items():
        try:
            token = int(k)
        except (TypeError, ValueError):
            raise RenderError("bad_body", f"{msg}; got key {k!r}", "body.logit_bias") from None
        ok = isinstance(b, (int, float)) and not isinstance(b, bool) and -100 <= b <= 100
        if token < 0 or not ok:
            raise RenderError("bad_body", f"{msg}; got {k!r}: {b!r}", "body.logit_bias")
        out.append((token, float(b)))
    return tuple(sorted(out))


def _token_ids(v: Any, key: str) -> tuple[int, ...] | None:
    if v is None:
        return None
    if not isinstance(v, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in v
    ):
        raise RenderError("bad_body", f"body.{key} must be a list of token ids", f"body.{key}")
    return tuple(v)


def _number(
    body: dict[str, Any], key: str, kind: type, lo: float | None = None, hi: float | None = None
) -> Any:
    v = body.get(key)
    if v is None:
        return None
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and (kind is float or v == int(v))
    if not ok or (lo is not None and v < lo) or (hi is not None and v > hi):
        bounds = f" in [{lo}, {hi}]" if hi is not None else (f" >= {lo}" if lo is not None else "")
        raise RenderError(
            "bad_body",
            f"body.{key} must be {'an integer' if kind is int else 'a number'}{bounds}, got {v!r}",
            f"body.{key}",
        )
    return kind(v)


def _stop(v: Any) -> tuple[str, ...] | None:
    if v is None:
        return None
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not all(isinstance(s, str) and s for s in v):
        raise RenderError(
            "bad_body", "body.stop must be a string or a list of non-empty strings", "body.stop"
        )
    return tuple(v)


def _messages(body: dict[str, Any]) -> list[dict[str, str]]:
    if "messages" not in body:
        raise RenderError("bad_body", "a chat completion body needs messages", "body.messages")
    msgs = validate_messages(body["messages"], "body.messages")
    return [{**m, "role": "system"} if m["role"] == "developer" else m for m in msgs]


def _prompt(body: dict[str, Any]) -> tuple[str, list[int] | None]:
    p = body.get("prompt")
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], (str, list)):
        p = p[0]  # a batch of one prompt
    if (
        isinstance(p, list)
        and p
        and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in p)
    ):
        return "", list(p)
    if not isinstance(p, str):
        raise RenderError(
            "bad_body",
            "body.prompt must be a string, one string in a list, or a"
            " list of token ids (several prompts per line are not supported yet)",
            "body.prompt",
        )
    if not p.strip():
        raise RenderError("empty_prompt", "body.prompt is empty", "body.prompt")
    return p, None
