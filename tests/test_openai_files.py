"""OpenAI batch files as other projects write them: content parts, Azure urls, BOMs, too-long
prompts, lines without a custom_id; every output and error line validates as a Batch API line."""

from __future__ import annotations

import json
import typing
from typing import Any

import pytest
from openai.types import Batch, BatchCreateParams, BatchError, Completion
from openai.types.chat import ChatCompletion
from pydantic import BaseModel, ConfigDict
from typer.testing import CliRunner

from jobrunner.cli import app
from jobrunner.config import JobConfig
from jobrunner.errors import ConfigError
from jobrunner.formats import make_preparer, read_rows
from jobrunner.formats.jsonl import parse_json_line
from jobrunner.formats.openai_batch.body import parse_line
from jobrunner.formats.openai_batch.output import error_record
from jobrunner.prep.render import RenderError
from jobrunner.types import Request, RowError, RowRef, SamplingParams
from tests.conftest import write_job

CHAT, COMPL = "/v1/chat/completions", "/v1/completions"
_ENDPOINT = typing.get_type_hints(BatchCreateParams, include_extras=True)["endpoint"]
ENDPOINTS = typing.get_args(typing.get_args(_ENDPOINT)[0])  # Required[Literal[...]]


class Response(BaseModel):
    model_config = ConfigDict(extra="forbid")
    status_code: int
    request_id: str
    body: dict[str, Any]


class BatchOutputLine(BaseModel):
    """A Batch API output/error file line, as OpenAI documents it (the openai package has
    no type for it); jobrunner's own fields (file, row, code, ...) may follow."""

    model_config = ConfigDict(extra="allow")
    id: str
    custom_id: str
    response: Response | None
    error: BatchError | None


def line(cid, url, body):
    return {"custom_id": cid, "method": "POST", "url": url, "body": body}


def render(messages, where=None):
    return "|".join(m["role"] + ":" + m["content"] for m in messages)


def parts(*items):
    return {"messages": [{"role": "user", "content": list(items)}]}


def text(t):
    return {"type": "text", "text": t}


def test_text_parts_are_joined_with_a_newline_as_vllm_does():
    got = parse_line(
        line("a", CHAT, parts(text("Name one"), text("colour."))), SamplingParams(), render
    )
    assert got.text == "user:Name one\ncolour."


@pytest.mark.parametrize(
    "part",
    [
        {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
        {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
        {"type": "file", "file": {"file_id": "file-abc"}},
    ],
)
def test_a_non_text_part_is_an_unsupported_line_naming_the_part(part):
    body = {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [text("What is in this?"), part]},
        ]
    }
    with pytest.raises(RenderError) as e:
        parse_line(line("a", CHAT, body), SamplingParams(), render)
    assert (e.value.code, e.value.field) == ("unsupported", "body.messages[1].content[1].type")
    assert part["type"] in str(e.value)


def test_azure_style_urls_are_aliases():
    chat = parse_line(line("a", "/chat/completions", parts(text("hi"))), SamplingParams(), render)
    compl = parse_line(line("b", "/completions", {"prompt": "x"}), SamplingParams(), render)
    assert (chat.endpoint, compl.endpoint) == (CHAT, COMPL)
    with pytest.raises(RenderError) as e:
        parse_line(line("c", "/v1/embeddings", {"input": "x"}), SamplingParams(), render)
    assert e.value.code == "unknown_endpoint"


def test_bom_and_bad_bytes_name_the_right_column(tmp_path):
    f = tmp_path / "b.jsonl"
    first = json.dumps(line("a", CHAT, parts(text("hi"))))
    f.write_bytes(
        b"\xef\xbb\xbf" + first.encode() + b'\n{"custom_id": "\xc3\xa9\xff"}\n{"x": 1,}\n'
    )
    ok, bad_utf8, malformed = read_rows(str(f), "openai-batch")
    assert ok.values["custom_id"] == "a"
    assert bad_utf8.code == "invalid_utf8" and "column 17" in bad_utf8.message  # é is one column
    assert malformed.code == "malformed_json" and "column 9" in malformed.message
    bad = parse_json_line(b'{"a": "\xc3\xa9\xc3\xa9", x}\n', RowRef("f", 0, 1)).message
    assert "malformed JSON at column 13:" in bad  # characters, the line's newline aside


def test_a_line_without_a_custom_id_gets_a_valid_error_line(tmp_path):
    f = tmp_path / "b.jsonl"
    f.write_text(
        "\n".join(
            json.dumps(x)
            for x in (
                {"method": "POST", "url": CHAT, "body": parts(text("hi"))},
                {"custom_id": 7, "method": "POST", "url": CHAT, "body": parts(text("hi"))},
            )
        )
        + "\n{broken\n"
    )
    cfg = JobConfig.model_validate({"input": {"path": str(f), "format": "openai-batch"}})
    prep = make_preparer(cfg, tokenizer=None)
    rows = list(read_rows(str(f), "openai-batch"))
    errors = [prep.row_id(rows[0]), prep.row_id(rows[1]), rows[2]]
    for e, code in zip(
        errors, ("missing_custom_id", "missing_custom_id", "malformed_json"), strict=True
    ):
        out = BatchOutputLine.model_validate(error_record(e))
        assert (out.error.code, out.response) == (code, None)
    assert [error_record(e)["custom_id"] for e in errors] == ["b.jsonl:0", "b.jsonl:1", "b.jsonl:2"]


def test_a_too_long_prompt_is_a_400_naming_the_body_field(tmp_path, tokenizer):
    long = "word " * 200
    f = tmp_path / "b.jsonl"
    f.write_text(
        json.dumps(line("c", "/chat/completions", parts(text(long))))
        + "\n"
        + json.dumps(line("p", COMPL, {"prompt": long}))
        + "\n"
    )
    cfg = JobConfig.model_validate(
        {"input": {"path": str(f), "format": "openai-batch"}, "model": {"max_model_len": 64}}
    )
    c, p = make_preparer(cfg, tokenizer).prepare(read_rows(str(f), "openai-batch"))
    assert (c.code, c.field, p.code, p.field) == (
        "too_long",
        "body.messages",
        "too_long",
        "body.prompt",
    )
    rec = BatchOutputLine.model_validate(error_record(c))
    assert rec.error is None and rec.response.status_code == 400
    err = rec.response.body["error"]
    assert (err["type"], err["code"], err["param"]) == (
        "invalid_request_error",
        "context_length_exceeded",
        "messages",
    )
    cfg.input.on_too_long = "truncate_left"
    c, p = make_preparer(cfg, tokenizer).prepare(read_rows(str(f), "openai-batch"))
    assert isinstance(c, Request) and isinstance(p, Request)
    assert len(c.prompt_token_ids) == 63 and c.sampling.max_new_tokens == 1


def test_a_lines_own_token_ids_past_the_vocabulary_fail_that_line_alone(tmp_path, tokenizer):
    f = tmp_path / "b.jsonl"
    body = {"messages": [{"role": "user", "content": "hi"}]}
    lines = [
        line("bias", "/chat/completions", {**body, "logit_bias": {"49152": 5}}),
        line("stop", "/chat/completions", {**body, "stop_token_ids": [2, 60000]}),
        line("fine", "/chat/completions", {**body, "logit_bias": {"49151": 5}}),
    ]
    f.write_text("".join(json.dumps(x) + "\n" for x in lines))
    cfg = JobConfig.model_validate({"input": {"path": str(f), "format": "openai-batch"}})
    bias, stop, fine = make_preparer(cfg, tokenizer).prepare(read_rows(str(f), "openai-batch"))
    assert (bias.code, bias.field, stop.code, stop.field) == (
        "bad_sampling",
        "logit_bias",
        "bad_sampling",
        "stop_token_ids",
    )
    assert "outside the model's vocabulary (size 49152): [60000]" in stop.message
    assert isinstance(fine, Request)
    cfg.generation.logit_bias = {49152: 5.0}  # the job's own: no line could run
    with pytest.raises(ConfigError, match="^generation.logit_bias: token id 49152 past"):
        make_preparer(cfg, tokenizer)


def test_engine_failures_keep_the_row_id_as_custom_id():
    rec = error_record(RowError("oom", "out of memory", RowRef("b.jsonl", 0, line=1), "y"))
    assert BatchOutputLine.model_validate(rec).custom_id == "y"


# ------------------------------------------------------------------ end to end, real model

AZURE = [
    line(
        "az-1", "/chat/completions", {"model": "my-deployment", **parts(text("Hi"), text("there"))}
    ),
    line(
        "az-2", "/completions", {"model": "my-deployment", "prompt": "The sky is", "max_tokens": 3}
    ),
    line("az-3", "/chat/completions", {"messages": [{"role": "user", "content": "Say hi."}]}),
]


@pytest.mark.slow
def test_an_azure_style_file_runs_and_every_line_validates(tmp_path):
    data = tmp_path / "azure.jsonl"
    data.write_bytes(b"\xef\xbb\xbf" + "\n".join(json.dumps(x) for x in AZURE).encode() + b"\n")
    job = write_job(
        tmp_path / "job.yaml",
        f"""
model: {{source: smollm2-135m-instruct, dtype: float32}}
input: {{path: {data}}}
output: {{path: {tmp_path / "out"}, format: openai-batch}}
generation: {{max_new_tokens: 4}}
engine: {{kv_cache_bytes: 50000000}}
""",
    )
    result = CliRunner().invoke(app, ["run", str(job)])
    assert result.exit_code == 0, result.output
    out = tmp_path / "out"
    lines = [json.loads(x) for x in (out / "output.jsonl").read_text().splitlines()]
    assert sorted(x["custom_id"] for x in lines) == ["az-1", "az-2", "az-3"]
    for x in lines:
        body = BatchOutputLine.model_validate(x).response.body
        kind = Completion if x["custom_id"] == "az-2" else ChatCompletion
        kind.model_validate(body)
    batch = Batch.model_validate(json.loads((out / "batch.json").read_text()))
    assert batch.error_file_id is None and batch.request_counts.failed == 0
    assert batch.endpoint in ENDPOINTS and batch.endpoint == CHAT
    assert batch.metadata["endpoints"] == f"{CHAT}=2,{COMPL}=1"
