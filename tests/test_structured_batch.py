"""Structured outputs end to end on the real model: an OpenAI batch file in the cookbook's
style (json_object, json_schema from a pydantic model, tools) and a job-file schema; every
output line validates with the openai types and every value with jsonschema."""

from __future__ import annotations

import json

import jsonschema
import pytest
from openai.lib._parsing._completions import type_to_response_format_param
from openai.types.chat import ChatCompletion
from pydantic import BaseModel, Field
from typer.testing import CliRunner

from jobrunner.cli import app
from tests.conftest import write_job

CHAT = "/v1/chat/completions"


class Colour(BaseModel):
    name: str = Field(max_length=12)
    warm: bool


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 16},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
CLOCK = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string", "maxLength": 8}},
            "required": ["zone"],
        },
    },
}


def line(cid, body):
    msgs = [{"role": "user", "content": body.pop("q")}]
    return {"custom_id": cid, "method": "POST", "url": CHAT, "body": {"messages": msgs, **body}}


LINES = [
    line(
        "obj",
        {
            "q": "Give a JSON object with a key colour.",
            "response_format": {"type": "json_object"},
            "max_tokens": 24,
        },
    ),
    line(
        "parse",
        {
            "q": "Name a colour.",
            "response_format": type_to_response_format_param(Colour),
            "max_tokens": 24,
        },
    ),
    line(
        "named",
        {
            "q": "Weather in Paris?",
            "tools": [WEATHER, CLOCK],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            "max_tokens": 64,
        },
    ),
    line(
        "required",
        {
            "q": "What time is it in UTC?",
            "tools": [WEATHER, CLOCK],
            "tool_choice": "required",
            "max_tokens": 64,
        },
    ),
    line("auto", {"q": "Weather?", "tools": [WEATHER]}),
    line(
        "bad-schema",
        {
            "q": "x",
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "b", "schema": {"type": "objectx"}},
            },
        },
    ),
    line(
        "short",
        {
            "q": "Name a colour.",
            "response_format": type_to_response_format_param(Colour),
            "max_tokens": 3,
        },
    ),
]


@pytest.fixture(scope="module")
def batch_out(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("structured_batch")
    data = tmp / "requests.jsonl"
    data.write_text("".join(json.dumps(x) + "\n" for x in LINES))
    job = write_job(
        tmp / "job.yaml",
        f"""
model: {{source: smollm2-135m-instruct, dtype: float32}}
input: {{path: {data}, max_error_rate: 0.5}}
output: {{path: {tmp / "out"}, format: openai-batch}}
engine: {{kv_cache_bytes: 50000000, speculative_tokens: 4}}
""",
    )
    result = CliRunner().invoke(app, ["run", str(job)])
    assert result.exit_code == 0, result.output
    out = tmp / "out"
    read = lambda name: [json.loads(x) for x in (out / name).read_text().splitlines()]  # noqa: E731
    return {o["custom_id"]: o for o in read("output.jsonl")}, read("errors.jsonl")


@pytest.mark.slow
def test_response_formats_and_tool_calls_validate(batch_out):
    outputs, _ = batch_out
    assert set(outputs) == {"obj", "parse", "named", "required", "short"}
    bodies = {k: ChatCompletion.model_validate(o["response"]["body"]) for k, o in outputs.items()}
    assert isinstance(json.loads(bodies["obj"].choices[0].message.content), dict)
    colour = bodies["parse"].choices[0]
    assert colour.finish_reason == "stop"
    Colour.model_validate_json(colour.message.content)  # what client...parse() would do
    for cid, tools in (("named", [WEATHER]), ("required", [WEATHER, CLOCK])):
        choice = bodies[cid].choices[0]
        assert (choice.finish_reason, choice.message.content) == ("tool_calls", None)
        (call,) = choice.message.tool_calls
        fn = next(t["function"] for t in tools if t["function"]["name"] == call.function.name)
        jsonschema.validate(json.loads(call.function.arguments), fn["parameters"])
    assert bodies["named"].choices[0].message.tool_calls[0].function.name == "get_weather"


@pytest.mark.slow
def test_a_cut_short_value_ends_with_length_and_is_marked(batch_out, tmp_path):
    outputs, _ = batch_out
    short = ChatCompletion.model_validate(outputs["short"]["response"]["body"]).choices[0]
    assert short.finish_reason == "length"
    with pytest.raises(ValueError):
        json.loads(short.message.content)


@pytest.mark.slow
def test_auto_tools_and_bad_schemas_are_line_errors(batch_out):
    _, errors = batch_out
    by_id = {e["custom_id"]: e for e in errors}
    assert set(by_id) == {"auto", "bad-schema"}
    auto = by_id["auto"]["error"]
    assert (auto["code"], auto["param"], auto["line"]) == ("unsupported", "body.tool_choice", 5)
    assert "required" in auto["message"]
    bad = by_id["bad-schema"]
    assert (bad["error"]["code"], bad["error"]["line"]) == ("bad_schema", 6)
    assert bad["error"]["param"] == "body.response_format.json_schema.schema"
    assert "requests.jsonl:line 6" in bad["message"] and "objectx" in bad["message"]


def test_validate_counts_the_lines_a_run_would_fail_for_their_schema(tmp_path):
    """A batch line whose schema does not compile is invalid to `validate` as to `run`."""
    data = tmp_path / "requests.jsonl"
    data.write_text("".join(json.dumps(x) + "\n" for x in LINES))
    job = write_job(
        tmp_path / "job.yaml",
        f"input: {{path: {data}, max_error_rate: 0.5}}\noutput: {{path: {tmp_path / 'out'}}}\n",
    )
    result = CliRunner().invoke(app, ["validate", str(job)])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["errors_by_code"] == {"unsupported": 1, "bad_schema": 1}
    assert "requests.jsonl:line 6" in result.output and "objectx" in result.output
