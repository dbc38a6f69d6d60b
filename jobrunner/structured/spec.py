"""What a constrained row's output must match, parsed from OpenAI-shaped objects. No torch.

One `OutputSpec` type for every source: the job's `generation.response_format`, `choice` and
`regex`, a row's `input.response_format_column`, and an OpenAI batch body's `response_format`
and `tools`/`tool_choice`. A spec is hashable and compares by what it constrains, so equal
schemas from different rows share one compiled grammar. Parsing errors are `SpecError`s naming
the key path (`body.response_format.json_schema.schema`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

Kind = Literal["json_schema", "json_object", "choice", "regex"]


class SpecError(ValueError):
    def __init__(self, message: str, field: str, code: str = "bad_response_format"):
        super().__init__(message)
        self.field = field
        self.code = code


@dataclass(frozen=True)
class OutputSpec:
    """`source` is canonical text: a schema's compact JSON, a regex, the labels' JSON.

    `tool` marks a forced tool call: the function's name when tool_choice names it (the output
    is its arguments), "" for tool_choice "required" (the output is `{"name", "arguments"}`).
    """

    kind: Kind
    source: str = ""
    tool: str | None = None
    name: str | None = field(default=None, compare=False)  # json_schema.name, for messages
    where: str = field(default="", compare=False)  # the key path it came from, for errors

    @property
    def label(self) -> str:
        return f"{self.kind}:{self.name}" if self.name else self.kind


# ---------------------------------------------------------------- response_format


def generation_spec(
    response_format: Any, choice: Any, regex: Any, where: str = "generation"
) -> OutputSpec | None:
    """The job's spec from `generation.response_format`, `.choice` and `.regex` (at most one)."""
    specs = [
        response_format_spec(response_format, f"{where}.response_format"),
        None if choice is None else choice_spec(choice, f"{where}.choice"),
        None if regex is None else regex_spec(regex, f"{where}.regex"),
    ]
    given = [s for s in specs if s is not None]
    if len(given) > 1:
        raise SpecError(
            f"give at most one of {where}.response_format, {where}.choice, {where}.regex",
            where,
        )
    return given[0] if given else None


def response_format_spec(value: Any, where: str) -> OutputSpec | None:
    """`{type: text}` (None), `{type: json_object}` or `{type: json_schema, json_schema: {name,
    schema, strict}}`, as an object or its JSON text."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as e:
            raise SpecError(f"{where} is not valid JSON: {e}", where) from e
    if not isinstance(value, dict):
        raise SpecError(f"{where} must be an object with a type", where)
    kind = value.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return OutputSpec("json_object", where=where)
    if kind != "json_schema":
        raise SpecError(
            f"{where}.type must be text, json_object or json_schema, got {kind!r}", f"{where}.type"
        )
    js = value.get("json_schema")
    if not isinstance(js, dict):
        raise SpecError(
            f"{where}.json_schema must be an object {{name, schema, strict}}",
            f"{where}.json_schema",
        )
    name = js.get("name")
    if name is not None and not isinstance(name, str):
        raise SpecError(f"{where}.json_schema.name must be a string", f"{where}.json_schema.name")
    schema = js.get("schema", {})  # OpenAI: an omitted schema allows any JSON object
    return schema_spec(schema, f"{where}.json_schema.schema", name)


def text_format_spec(value: Any, where: str) -> OutputSpec | None:
    """The Responses API's `text.format`: as a response_format, but a json_schema format holds
    its name, schema and strict beside the type (`{type: json_schema, name, schema}`)."""
    if not isinstance(value, dict) or value.get("type") != "json_schema":
        return response_format_spec(value, where)
    name = value.get("name")
    if name is not None and not isinstance(name, str):
        raise SpecError(f"{where}.name must be a string", f"{where}.name")
    return schema_spec(value.get("schema", {}), f"{where}.schema", name)


def schema_spec(schema: Any, where: str, name: str | None = None) -> OutputSpec:
    if isinstance(schema, bool) or not isinstance(schema, dict):
        raise SpecError(f"{where} must be a JSON Schema object", where)
    return OutputSpec("json_schema", canonical(schema), name=name, where=where)


def choice_spec(labels: Any, where: str) -> OutputSpec:
    if (
        not isinstance(labels, list)
        or not labels
        or not all(isinstance(x, str) and x for x in labels)
    ):
        raise SpecError(f"{where} must be a non-empty list of non-empty strings", where)
    return OutputSpec("choice", json.dumps(labels, ensure_ascii=False), where=where)


def regex_spec(pattern: Any, where: str) -> OutputSpec:
    if not isinstance(pattern, str) or not pattern:
        raise SpecError(f"{where} must be a non-empty regular expression", where)
    return OutputSpec("regex", pattern, where=where)


def canonical(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))  # key order is output order


# ---------------------------------------------------------------- tools


def tool_spec(tools: Any, tool_choice: Any, where: str = "body") -> OutputSpec | None:
    """The call a line must answer with, from `tools` and `tool_choice` ("required" or a named
    function); None for no tools or `tool_choice: "none"`. "auto" is refused: deciding whether
    to call a tool at all needs the model's own tool-call format, which is not supported yet."""
    if tools in (None, []):
        return None
    functions = _functions(tools, f"{where}.tools")
    if tool_choice is None or tool_choice == "auto":
        raise SpecError(
            f'{where}.tool_choice "auto" (the default when tools are given) is not supported'
            ' yet: set tool_choice to "required" or {"type": "function", "function":'
            ' {"name": ...}} to get a call',
            f"{where}.tool_choice",
            "unsupported",
        )
    if tool_choice == "none":
        return None
    if tool_choice == "required":
        calls = [_call_schema(n, p) for n, p in functions]
        schema = calls[0] if len(calls) == 1 else {"anyOf": calls}
        path = f"{where}.tools" if len(calls) > 1 else f"{where}.tools[0].function.parameters"
        return OutputSpec("json_schema", canonical(schema), "", where=path)
    name = _named(tool_choice, f"{where}.tool_choice")
    for i, (n, params) in enumerate(functions):
        if n == name:
            path = f"{where}.tools[{i}].function.parameters"
            return OutputSpec("json_schema", canonical(params), n, name=n, where=path)
    raise SpecError(
        f"{where}.tool_choice names {name!r}, which is not among {where}.tools",
        f"{where}.tool_choice",
    )


def _functions(tools: Any, where: str) -> list[tuple[str, dict[str, Any]]]:
    if not isinstance(tools, list):
        raise SpecError(f"{where} must be a list of functions", where)
    out = []
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) and t.get("type") == "function" else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise SpecError(
                f'{where}[{i}] must be {{"type": "function", "function": {{"name", "parameters"}}}}',
                f"{where}[{i}]",
            )
        params = fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, dict):
            raise SpecError(
                f"{where}[{i}].function.parameters must be a JSON Schema object",
                f"{where}[{i}].function.parameters",
            )
        out.append((fn["name"], params))
    return out


def _named(tool_choice: Any, where: str) -> str:
    fn = tool_choice.get("function") if isinstance(tool_choice, dict) else None
    if not (isinstance(fn, dict) and tool_choice.get("type") == "function" and fn.get("name")):
        raise SpecError(
            f'{where} must be "none", "auto", "required" or'
            ' {"type": "function", "function": {"name": ...}}',
            where,
        )
    return fn["name"]


def _call_schema(name: str, params: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"name": {"const": name}, "arguments": params},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }
