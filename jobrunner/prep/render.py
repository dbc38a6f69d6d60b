"""Render a row into prompt text: a text column, chat messages, or a template over columns.

Templates use `{column}` fields only (no attribute or index access, no code execution). Text
prompts go through the tokenizer's chat template as a user message when the model has one and
`input.use_chat_template` is on, so instruct models get the format they were trained on.
"""

from __future__ import annotations

import base64
import json
import math
import re
import string
from functools import cached_property
from typing import Any

from jobrunner.config import InputConfig
from jobrunner.errors import ConfigError
from jobrunner.types import kind_of


class RenderError(ValueError):
    def __init__(self, code: str, message: str, field: str | None = None):
        super().__init__(message)
        self.code = code
        self.field = field


MAX_SPEC_NUMBER = 10_000  # a width or precision past this is refused (one row, gigabytes)


def template_fields(template: str) -> list[str]:
    """The column names a template uses, each field's name taken whole (`{Review Text}`,
    `{user.name}`, `{a[0]}` name such columns: no attribute or index is ever looked up);
    rejects positional `{}`, nested fields in a format spec and widths or precisions over
    MAX_SPEC_NUMBER."""
    names = []
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as e:
        raise RenderError("bad_template", f"not a valid template: {e}") from e
    for _, name, spec, _ in parsed:
        if name is None:
            continue
        if not name:
            raise RenderError("bad_template", "template field {}: name a column, as {text}")
        if spec and "{" in spec:
            raise RenderError("bad_template", f"template field {{{name}:{spec}}}: nested fields")
        big = [n for n in re.findall(r"\d+", spec or "") if int(n) > MAX_SPEC_NUMBER]
        if big:
            raise RenderError(
                "bad_template",
                f"template field {{{name}:{spec}}}: width or precision {big[0]} is over"
                f" {MAX_SPEC_NUMBER}",
            )
        names.append(name)
    return names


def nameable(column: str) -> bool:
    """Whether a template field `{column}` names this column (not one holding `:`, `!`, `{`)."""
    try:
        return template_fields("{" + column + "}") == [column]
    except RenderError:
        return False


def aliased_template(template: str, fields: list[str]) -> str:
    """The template with its i-th distinct field named `c<i>`, for str.format_map, which would
    read `{a.b}` as an attribute of `a` and `{a[0]}` as an index: `render` maps the aliases to
    the columns' values."""
    alias = {name: f"c{i}" for i, name in enumerate(dict.fromkeys(fields))}
    out = []
    for literal, name, spec, conv in string.Formatter().parse(template):
        out.append(literal.replace("{", "{{").replace("}", "}}"))
        if name is not None:
            out.append("{" + alias[name] + (f"!{conv}" if conv else "") + f":{spec or ''}}}")
    return "".join(out)


# Texts a template that inspects message content (trims, or branches on a prefix) renders
# differently from a plain copy; user_turn only takes the fast path for _plain texts.
FRAME_PROBES = ("a", "Two words.", "line one\nline two", "{{ x }} {% y %}", "émoji ✓ 字", "a  b")


class Framed(str):
    """A chat-templated prompt made of the template's frame around `content` (user_turn)."""

    __slots__ = ("content",)

    def __new__(cls, text: str, content: str) -> Framed:
        out = super().__new__(cls, text)
        out.content = content
        return out

    def __reduce__(self) -> tuple[type, tuple[str]]:  # pickled or copied: the text alone
        return str, (str(self),)


class Segmented(str):
    """Chat text whose message contents hold special-token text, in `pieces`: (text, content)
    pairs in order; content pieces are tokenized with their special-token text as text."""

    __slots__ = ("pieces",)

    def __new__(cls, pieces: list[tuple[str, bool]]) -> Segmented:
        out = super().__new__(cls, "".join(p for p, _ in pieces))
        out.pieces = tuple(pieces)
        return out

    def __reduce__(self) -> tuple[type, tuple[str]]:
        return str, (str(self),)


def _plain(text: str) -> bool:
    """No surrounding whitespace and no leading markup: what FRAME_PROBES vouch for."""
    return not (text[0].isspace() or text[-1].isspace()) and text[0] not in "<[/{#@!"


class PromptRenderer:
    def __init__(self, cfg: InputConfig, tokenizer: Any) -> None:
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.use_chat = bool(cfg.use_chat_template and getattr(tokenizer, "chat_template", None))
        if (  # the id scans have no tokenizer
            tokenizer is not None
            and cfg.prompt.messages_column
            and not getattr(tokenizer, "chat_template", None)
        ):
            raise ConfigError(  # every row would fail alike: the job's, before any row runs
                "input.prompt.messages_column: the model's tokenizer has no chat template to"
                " render messages with (a base model); give a chat model, or a text prompt"
                " (input.prompt.column or template), which runs without one"
            )
        try:
            self.fields = template_fields(cfg.prompt.template) if cfg.prompt.template else []
        except RenderError as e:  # the job's template, not a row: a configuration error
            raise ConfigError(f"input.prompt.template: {e}") from e
        self.columns = list(dict.fromkeys(self.fields))  # field c<i> of the aliased template
        self.aliased = aliased_template(cfg.prompt.template or "", self.fields)

    @property
    def adds_special_tokens(self) -> bool:
        """Chat-templated text already holds the special tokens; plain text gets the defaults."""
        return not self.use_chat and not self.cfg.prompt.messages_column

    def render(self, values: dict[str, Any]) -> str:
        p = self.cfg.prompt
        if p.messages_column:
            return self.chat(self._messages(values, p.messages_column), where=p.messages_column)
        text = self._column_text(values, p.column) if p.column else self._template(values)
        if not text or text.isspace():
            raise RenderError("empty_prompt", "the prompt is empty or whitespace only", p.column)
        if not self.use_chat:
            return f"{self.cfg.system_prompt}\n\n{text}" if self.cfg.system_prompt else text
        return self.user_turn(text)

    def user_turn(self, text: str) -> str:
        """One user message through the chat template: the template's text around a plain
        message is rendered once (`_frame`), since Jinja per row costs more than tokenizing."""
        frame = self._frame
        if frame is None or not _plain(text) or self._holds_special(text):
            return self.chat([{"role": "user", "content": text}])
        return Framed(f"{frame[0]}{text}{frame[1]}", text)

    @cached_property
    def frame_token_ids(self) -> tuple[list[int], list[int]] | None:
        """Token ids of the frame's two sides, if tokenizing a framed text equals tokenizing its
        sides and its user text apart (true at special-token and newline boundaries of
        byte-level BPE; checked on FRAME_PROBES), else None."""
        if self._frame is None:
            return None
        before, after = self._frame
        ids = self.tokenizer([before, after, *FRAME_PROBES], add_special_tokens=False)["input_ids"]
        full = self.tokenizer(
            [f"{before}{p}{after}" for p in FRAME_PROBES], add_special_tokens=False
        )["input_ids"]
        pre, post = list(ids[0]), list(ids[1])
        if any(list(f) != pre + list(p) + post for f, p in zip(full, ids[2:], strict=True)):
            return None
        return pre, post

    @cached_property
    def _frame(self) -> tuple[str, str] | None:
        """(before, after) the user text, if the template copies a plain message verbatim:
        probes with leading symbols, inner newlines, braces and markup must render as
        before + probe + after, else every row goes through Jinja."""
        marker = "\u2063jobrunner-frame\u2063"
        out = self.chat([{"role": "user", "content": marker}])
        if out.count(marker) != 1:
            return None
        before, after = out.split(marker)
        for probe in FRAME_PROBES:
            if self.chat([{"role": "user", "content": probe}]) != f"{before}{probe}{after}":
                return None
        return before, after

    def chat(
        self,
        messages: list[dict[str, str]],
        tools: list[Any] | None = None,
        where: str = "messages",
    ) -> str:
        """Templated chat text; `tools` (OpenAI function tools) reach templates that render them.
        `where`: the messages' field, for errors (`body.messages`, the messages column)."""
        fields = [f"{where}[{i}]" for i in range(len(messages))]
        if self.cfg.system_prompt and not any(m["role"] == "system" for m in messages):
            messages = [{"role": "system", "content": self.cfg.system_prompt}, *messages]
            fields = ["input.system_prompt", *fields]
        if not getattr(self.tokenizer, "chat_template", None):
            raise RenderError("no_chat_template", "the model's tokenizer has no chat template")
        extra = {"tools": tools} if tools else {}
        self._check_names(messages, fields)
        if any(self._holds_special(m["content"]) for m in messages):
            return self._segmented(messages, extra, fields)
        return self._apply(messages, extra)

    def _apply(self, messages: list[dict[str, str]], extra: dict[str, Any]) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, **extra
        )

    @cached_property
    def _specials(self) -> re.Pattern | None:
        """The special tokens' texts, when input.special_tokens keeps them text in content."""
        if self.cfg.special_tokens != "text":
            return None
        decoder = getattr(self.tokenizer, "added_tokens_decoder", {})
        texts = sorted({t.content for t in decoder.values() if t.special and t.content}, key=len)
        return re.compile("|".join(map(re.escape, texts[::-1]))) if texts else None

    def _holds_special(self, content: str) -> bool:
        return self._specials is not None and self._specials.search(content) is not None

    def _check_names(self, messages: list[dict[str, str]], fields: list[str]) -> None:
        """A name is short and rendered in the turn's header, where special-token text would
        close the turn: refused as text (input.special_tokens: parse reads it as tokens)."""
        for i, m in enumerate(messages):
            if "name" in m and self._holds_special(m["name"]):
                raise RenderError(
                    "special_tokens",
                    f"{fields[i]}.name holds special-token text"
                    f" ({self._specials.search(m['name']).group()!r}): remove it, or set"
                    " input.special_tokens: parse to read it as control tokens",
                    f"{fields[i]}.name",
                )

    def _segmented(
        self, messages: list[dict[str, str]], extra: dict[str, Any], fields: list[str]
    ) -> Segmented:
        """The chat text with the contents that hold special-token text marked as such: the
        template renders a marker in each such content's place (the other messages as they
        are), and the result must equal the real rendering with the contents (or, for templates
        that trim them, the trimmed contents) put back."""
        text = self._apply(messages, extra)
        held = [i for i, m in enumerate(messages) if self._holds_special(m["content"])]
        marks = {i: f"\u2063jobrunner-content-{i}\u2063" for i in held}
        marked = [{**m, "content": marks[i]} if i in marks else m for i, m in enumerate(messages)]
        out = self._apply(marked, extra)
        for trim in (False, True):
            pieces, rest = [], out
            for i, mark in marks.items():
                if rest.count(mark) != 1:
                    continue
                before, rest = rest.split(mark)
                content = messages[i]["content"]
                pieces += [(before, False), (content.strip() if trim else content, True)]
            pieces.append((rest, False))
            if "".join(p for p, _ in pieces) == text:
                return Segmented([p for p in pieces if p[0]])
        i = held[0]
        raise RenderError(
            "special_tokens",
            f"{fields[i]}.content holds special-token text"
            f" ({self._specials.search(messages[i]['content']).group()!r}) where the chat template"
            " changes the content, so it cannot be kept as text: remove it, or set"
            " input.special_tokens: parse to read it as control tokens",
            f"{fields[i]}.content",
        )

    def _column_text(self, values: dict[str, Any], column: str) -> str:
        if column not in values:
            raise RenderError("missing_field", f"the prompt column {column!r} is missing", column)
        v = values[column]
        if v is None:
            raise RenderError("empty_prompt", f"the prompt column {column!r} is null", column)
        if isinstance(v, BYTES):
            return binary_text(v, f"the prompt column {column!r}", column)
        if not isinstance(v, str):
            raise RenderError("bad_type", f"{column!r} must be a string, got {kind_of(v)}", column)
        return v

    def _template(self, values: dict[str, Any]) -> str:
        missing = [f for f in self.fields if f not in values or values[f] is None]
        if missing:
            raise RenderError(
                "missing_field", f"template fields missing or null: {missing}", missing[0]
            )
        size = sum(
            len(v) if isinstance(v, (str, bytes)) else 0 for v in map(values.get, self.fields)
        )
        if size > self.cfg.max_prompt_chars:
            raise RenderError(
                "too_long",
                f"the template's fields hold {size:,} characters, over input.max_prompt_chars"
                f" {self.cfg.max_prompt_chars:,}",
                self.fields[0],
            )
        fields = {f"c{i}": _field_value(values[f], f) for i, f in enumerate(self.columns)}
        try:
            return self.aliased.format_map(fields)
        except (ValueError, TypeError, OverflowError) as e:
            raise RenderError(
                "bad_format",
                f"a value does not fit the template's format spec: {e}",
                self._misfit(values),
            ) from e

    def _misfit(self, values: dict[str, Any]) -> str | None:
        """The first field whose value its format spec refuses."""
        fmt = string.Formatter()
        for _, name, spec, conv in fmt.parse(self.cfg.prompt.template):
            if name is None:
                continue
            try:
                format(fmt.convert_field(_field_value(values[name], name), conv), spec or "")
            except (ValueError, TypeError, OverflowError):
                return name
        return None

    def _messages(self, values: dict[str, Any], column: str) -> list[dict[str, str]]:
        if column not in values or values[column] is None:
            raise RenderError("missing_field", f"the messages column {column!r} is missing", column)
        msgs = values[column]
        if isinstance(msgs, str):
            import json

            try:
                msgs = json.loads(msgs)
            except ValueError as e:
                raise RenderError(
                    "bad_type", f"{column!r}: not a JSON list of messages", column
                ) from e
        return validate_messages(msgs, column)


BYTES = (bytes, bytearray, memoryview)


def binary_text(v: bytes | bytearray | memoryview, what: str, field: str) -> str:
    """A binary value as the UTF-8 text it holds: Hive, Impala and older Spark write string
    columns as Parquet BINARY without the UTF8 annotation, so they arrive as bytes. Bytes that
    are not UTF-8 fail the row, naming the field: never their Python repr (b'...')."""
    try:
        return bytes(v).decode("utf-8")
    except UnicodeDecodeError as e:
        raise RenderError(
            "invalid_utf8", f"{what} is binary and not UTF-8 text (byte {e.start})", field
        ) from e


def _field_value(v: Any, field: str) -> Any:
    if isinstance(v, BYTES):
        return binary_text(v, f"template field {{{field}}}", field)
    if isinstance(v, (list, tuple, dict)):
        return nested_text(v)
    return v


def nested_text(v: Any) -> str:
    """A list, map or struct value as JSON for a template field (a map as an object, bytes as
    their text, a date or decimal as its str()), never Python's repr: single quotes, None,
    `datetime.datetime(2024, 1, 1, 0, 0)`, a map's `[('k', 1)]`."""
    return json.dumps(_jsonable(v), ensure_ascii=False, default=str)


def _jsonable(v: Any) -> Any:
    if isinstance(v, list) and isinstance(_map_as_dict(v), dict):
        v = _map_as_dict(v)
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, BYTES):
        try:
            return bytes(v).decode("utf-8")
        except UnicodeDecodeError:
            return base64.b64encode(bytes(v)).decode("ascii")
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def validate_messages(msgs: Any, column: str = "messages") -> list[dict[str, str]]:
    if not isinstance(msgs, list) or not msgs:
        raise RenderError("bad_type", f"{column!r} must be a non-empty list of messages", column)
    out = []
    for i, m in enumerate(msgs):
        m = _map_as_dict(m)
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise RenderError("bad_type", f"{column}[{i}] must be an object with a role", column)
        content = m.get("content")
        if isinstance(content, list):
            content = content_text(content, f"{column}[{i}].content")
        if m.get("tool_calls") or m.get("function_call"):
            raise RenderError(
                "unsupported",
                f"{column}[{i}] is a turn of tool calls: earlier tool calls in the messages are"
                " not supported (turns are rendered as text); send them as text, or remove them",
                f"{column}[{i}].tool_calls",
            )
        if not isinstance(content, str):
            got = "null" if content is None else type(content).__name__
            raise RenderError(
                "bad_type",
                f"{column}[{i}].content must be a string or a list of text parts, got {got}",
                column,
            )
        out.append({"role": m["role"], "content": content, **_name(m, f"{column}[{i}]")})
    if not any(m["content"].strip() for m in out):
        raise RenderError("empty_prompt", f"every message in {column!r} is empty", column)
    return out


def _name(m: dict[str, Any], where: str) -> dict[str, str]:
    """A message's `name` (OpenAI's participant name), kept for templates that render it."""
    name = m.get("name")
    if name is None:
        return {}
    if not isinstance(name, str):
        raise RenderError("bad_type", f"{where}.name must be a string", f"{where}.name")
    return {"name": name}


def _map_as_dict(m: Any) -> Any:
    """A Parquet map message (Spark's map<string,string>, read as a list of (key, value)
    pairs) as the object it is; anything else as it is."""
    if isinstance(m, list) and m and all(isinstance(kv, tuple) and len(kv) == 2 for kv in m):
        return dict(m)
    return m


# Parts that carry text, and the key holding it (an assistant's refusal is text too).
TEXT_PARTS = {"text": "text", "refusal": "refusal"}


def content_text(parts: list[Any], where: str) -> str:
    """OpenAI content parts as one string: text parts joined with a newline, as vLLM and
    SGLang join them. Any other part (image_url, input_audio, file) is refused: the model reads
    text only, and dropping the part would answer a question nobody asked."""
    texts = []
    for j, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in TEXT_PARTS:
            raise RenderError(
                "unsupported",
                f"{where}[{j}].type {kind!r} is not supported: this model reads text only"
                " (send text parts, or remove the part)",
                f"{where}[{j}].type",
            )
        text = part.get(TEXT_PARTS[kind])
        if not isinstance(text, str):
            raise RenderError(
                "bad_type", f"{where}[{j}].{TEXT_PARTS[kind]} must be a string", f"{where}[{j}]"
            )
        texts.append(text)
    return "\n".join(texts)
