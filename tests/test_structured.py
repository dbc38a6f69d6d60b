"""Structured outputs without the model: spec parsing from every source, grammar compiling and
caching, and the per-row matcher masking logits (with the real tokenizer)."""

from __future__ import annotations

import json

import pytest
import torch
from openai.lib._parsing._completions import type_to_response_format_param
from pydantic import BaseModel, Field

from jobrunner.config import JobConfig
from jobrunner.errors import ConfigError
from jobrunner.structured.spec import (
    OutputSpec,
    SpecError,
    generation_spec,
    response_format_spec,
    tool_spec,
)

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time"}}


class Person(BaseModel):
    name: str = Field(max_length=8)
    age: int = Field(ge=0, le=130)


def test_response_formats_parse_from_objects_and_json_text():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    obj = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}}
    a = response_format_spec(obj, "generation.response_format")
    b = response_format_spec(json.dumps(obj), "col")
    assert a == b and a.kind == "json_schema" and json.loads(a.source) == schema
    assert a.where == "generation.response_format.json_schema.schema" and b.where.startswith("col")
    assert response_format_spec({"type": "text"}, "x") is None
    assert response_format_spec({"type": "json_object"}, "x").kind == "json_object"
    parse = type_to_response_format_param(Person)  # what client.chat.completions.parse sends
    spec = response_format_spec(parse, "body.response_format")
    assert spec.name == "Person" and json.loads(spec.source)["required"] == ["name", "age"]


@pytest.mark.parametrize(
    "value, field",
    [
        ({"type": "xml"}, "r.type"),
        ({"type": "json_schema"}, "r.json_schema"),
        ({"type": "json_schema", "json_schema": {"schema": [1]}}, "r.json_schema.schema"),
        ("{not json", "r"),
    ],
)
def test_bad_response_formats_name_their_key(value, field):
    with pytest.raises(SpecError) as e:
        response_format_spec(value, "r")
    assert e.value.field == field


def test_tools_become_one_forced_call():
    named = tool_spec([WEATHER, TIME], {"type": "function", "function": {"name": "get_weather"}})
    assert named.tool == "get_weather" and named.where == "body.tools[0].function.parameters"
    assert json.loads(named.source) == WEATHER["function"]["parameters"]  # just the arguments
    required = tool_spec([WEATHER, TIME], "required")
    assert required.tool == ""
    required = json.loads(required.source)
    assert [c["properties"]["name"]["const"] for c in required["anyOf"]] == [
        "get_weather",
        "get_time",
    ]
    assert tool_spec([WEATHER], "none") is None and tool_spec(None, None) is None
    for choice in ("auto", None):
        with pytest.raises(SpecError) as e:
            tool_spec([WEATHER], choice)
        assert (e.value.code, e.value.field) == ("unsupported", "body.tool_choice")
        assert '"required"' in str(e.value)
    with pytest.raises(SpecError, match="not among"):
        tool_spec([WEATHER], {"type": "function", "function": {"name": "nope"}})


def test_job_keys_validate_at_load_time():
    cfg = JobConfig.model_validate({"generation": {"choice": ["yes", "no"]}})
    assert generation_spec(None, cfg.generation.choice, None) == OutputSpec(
        "choice", '["yes", "no"]'
    )
    with pytest.raises(ValueError, match="at most one"):
        JobConfig.model_validate({"generation": {"choice": ["a"], "regex": "a+"}})
    with pytest.raises(ValueError, match="type must be"):
        JobConfig.model_validate({"generation": {"response_format": {"type": "yaml"}}})


def test_a_bad_job_key_is_a_config_error_naming_the_line(tmp_path):
    from jobrunner.config import load_job

    job = tmp_path / "job.yaml"
    job.write_text("generation:\n  choice: []\n")
    with pytest.raises(ConfigError, match="job.yaml:1 generation"):
        load_job(job)


@pytest.mark.parametrize(
    "generation, where",
    [
        (
            "response_format: {type: json_schema, json_schema: {name: p, schema: {type: object,"
            ' properties: {x: {type: string, pattern: "(?<=a)b"}}}}}',
            "generation.response_format.json_schema.schema",
        ),
        ("regex: '[0-9'", "generation.regex"),
    ],
)
def test_a_job_spec_that_does_not_compile_exits_78_before_any_row(tmp_path, generation, where):
    from typer.testing import CliRunner

    from jobrunner.cli import app

    data = tmp_path / "rows.jsonl"
    data.write_text('{"id": "a", "text": "hi"}\n')
    job = tmp_path / "job.yaml"
    job.write_text(
        f"input: {{path: {data}, prompt: {{column: text}}}}\n"
        f"output: {{path: {tmp_path / 'out'}}}\n"
        f"generation: {{{generation}}}\n"
    )
    for command in ("validate", "run"):
        result = CliRunner().invoke(app, [command, str(job)])
        assert result.exit_code == 78, result.output
        summary = json.loads(result.stdout.strip().splitlines()[-1])
        assert summary["error"].startswith(f"{job}: {where} does not compile: ")
    assert not (tmp_path / "out").exists()  # refused before the run directory or the model


# ------------------------------------------------------------------ grammars (real tokenizer)


@pytest.fixture(scope="module")
def grammars():
    from jobrunner.config import ModelConfig
    from jobrunner.engine.loader import load_tokenizer
    from jobrunner.structured.grammar import Grammars

    tok = load_tokenizer(ModelConfig())
    return Grammars(tok, 49152, [tok.eos_token_id])


def drive(grammars, spec, pick):
    """Decode under the grammar, choosing each token with pick(allowed ids): the text the
    matcher accepted, and whether it ended complete."""
    proc = grammars.processor(spec)
    eos, ids = grammars.stop_token_ids[0], []
    for _ in range(60):
        logits = torch.zeros(1, grammars.vocab_size)
        grammars.apply(logits, [proc], [0])
        allowed = torch.isfinite(logits[0]).nonzero().flatten().tolist()
        t = pick(allowed)
        proc.accept([t])
        if t == eos:
            break
        ids.append(t)
    return grammars.tokenizer.decode(ids), proc.complete


def test_each_distinct_spec_compiles_once(grammars):
    a = response_format_spec({"type": "json_object"}, "a")
    b = response_format_spec({"type": "json_object"}, "b")
    grammars.compile(a)
    grammars.processor(b)
    grammars.processor(a)
    assert grammars.stats[a].rows == 2 and len([s for s in grammars.stats if s == a]) == 1


def test_choice_regex_and_schema_hold_whatever_the_pick(grammars):
    eos = grammars.stop_token_ids[0]
    first = min  # the lowest allowed id: an adversarial, not a likely, pick
    last = lambda allowed: max(t for t in allowed if t != eos) if allowed != [eos] else eos  # noqa: E731
    labels = OutputSpec("choice", json.dumps(["positive", "négatif", 'say "x"']))
    for pick in (first, last):
        text, done = drive(grammars, labels, pick)
        assert done and text in ("positive", "négatif", 'say "x"')
    text, done = drive(grammars, OutputSpec("regex", r"[0-9]{3}-[a-z]{2}"), first)
    assert done and len(text) == 6 and text[3] == "-"
    schema = json.loads(response_format_spec(type_to_response_format_param(Person), "r").source)
    text, done = drive(grammars, OutputSpec("json_schema", json.dumps(schema)), first)
    assert done
    value = json.loads(text)
    assert set(value) == {"name", "age"} and 0 <= value["age"] <= 130


def test_a_schema_that_does_not_compile_names_its_path(grammars):
    from jobrunner.structured.grammar import GrammarError

    bad = OutputSpec("json_schema", '{"type": "objectx"}', where="body.response_format.x")
    for _ in range(2):  # the failure is cached too, and raised for every row
        with pytest.raises(GrammarError) as e:
            grammars.compile(bad)
        assert e.value.where == "body.response_format.x" and "objectx" in str(e.value)
        assert "/project/cpp" not in str(e.value)
    with pytest.raises(GrammarError):
        grammars.compile(OutputSpec("regex", "(abc", where="generation.regex"))


def test_masks_touch_only_constrained_rows(grammars):
    spec = OutputSpec("choice", json.dumps(["yes", "no"]))
    p1, p2 = grammars.processor(spec), grammars.processor(spec)
    logits = torch.randn(4, grammars.vocab_size)
    before = logits.clone()
    grammars.apply(logits, [p1, p2], [1, 3])
    assert torch.equal(logits[0], before[0]) and torch.equal(logits[2], before[2])
    for row in (1, 3):
        allowed = torch.isfinite(logits[row]).nonzero().flatten().tolist()
        words = {grammars.tokenizer.decode([t]) for t in allowed}
        assert words and all("yes".startswith(w) or "no".startswith(w) for w in words)
