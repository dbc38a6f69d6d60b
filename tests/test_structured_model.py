"""Constrained decoding on the real model, over 200 rows in one engine run: seven JSON schemas
(nested objects, arrays, enums, bounded numbers, required and optional fields, two tool calls),
labels and a regex, greedy and sampled, with chunked prefill, the prefix cache and preemption
all at work. Every output must be whole and valid."""

from __future__ import annotations

import json
import re

import jsonschema
import pyarrow.parquet as pq
import pytest

from jobrunner.config import JobConfig
from jobrunner.engine.paged import PagedEngine
from jobrunner.structured.spec import OutputSpec, choice_spec, regex_spec, schema_spec, tool_spec
from jobrunner.types import Request, SamplingParams
from tests.conftest import SAMPLES

S = {"type": "string", "maxLength": 8}
SCHEMAS = {
    "nested": {
        "type": "object",
        "properties": {
            "person": {
                "type": "object",
                "properties": {"name": S, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
                "required": ["name", "age"],
            },
            "city": S,
        },
        "required": ["person", "city"],
    },
    "array": {
        "type": "object",
        "properties": {"tags": {"type": "array", "items": S, "minItems": 1, "maxItems": 3}},
        "required": ["tags"],
    },
    "enums": {
        "type": "object",
        "properties": {
            "sentiment": {"enum": ["positive", "negative", "neutral"]},
            "confidence": {"type": "string", "enum": ["low", "high"]},
        },
        "required": ["sentiment", "confidence"],
    },
    "bounded": {
        "type": "object",
        "properties": {
            "rating": {"type": "integer", "minimum": 1, "maximum": 10},
            "share": {"type": "integer", "minimum": -5, "maximum": 5},
        },
        "required": ["rating", "share"],
    },
    "optional": {
        "type": "object",
        "properties": {
            "title": S,
            "year": {"type": "integer", "minimum": 1900, "maximum": 2100},
            "draft": {"type": "boolean"},
        },
        "required": ["title"],
    },
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "parameters": {
                "type": "object",
                "properties": {"term": S, "limit": {"type": "integer", "minimum": 1, "maximum": 9}},
                "required": ["term", "limit"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "flag",
            "parameters": {
                "type": "object",
                "properties": {"level": {"enum": ["info", "warn"]}},
                "required": ["level"],
            },
        },
    },
]
LABELS = ["question", "summary", "explanation"]
REGEX = r"[A-Z][a-z]{2,8} [0-9]{1,3}"


def chat_ids(tokenizer, text: str) -> list[int]:
    templated = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
    )
    return tokenizer(templated, add_special_tokens=False)["input_ids"]


def specs() -> list[tuple[str, OutputSpec]]:
    out = [(k, schema_spec(v, f"schemas.{k}")) for k, v in SCHEMAS.items()]
    named = {"type": "function", "function": {"name": "lookup"}}
    out += [("named", tool_spec(TOOLS, named)), ("required", tool_spec(TOOLS, "required"))]
    return out + [("choice", choice_spec(LABELS, "choice")), ("regex", regex_spec(REGEX, "regex"))]


def check(kind: str, text: str) -> None:
    if kind == "choice":
        assert text in LABELS
    elif kind == "regex":
        assert re.fullmatch(REGEX, text)
    elif kind == "named":
        jsonschema.validate(json.loads(text), TOOLS[0]["function"]["parameters"])
    elif kind == "required":
        call = json.loads(text)
        fn = next(t["function"] for t in TOOLS if t["function"]["name"] == call["name"])
        jsonschema.validate(call["arguments"], fn["parameters"])
    else:
        jsonschema.validate(json.loads(text), SCHEMAS[kind])


@pytest.mark.slow
def test_every_constrained_output_is_whole_and_valid(model_f32):
    tok = model_f32.tokenizer
    rows = pq.read_table(SAMPLES / "prompts.parquet", columns=["prompt"]).to_pylist()
    kinds = specs()
    reqs, kind_of = [], {}
    for i in range(200):
        kind, spec = kinds[i % len(kinds)]
        text = f"Answer as {kind}. {rows[i % len(rows)]['prompt'][:100]}"
        ids = chat_ids(tok, text)
        sampled = i % 3 == 0
        params = SamplingParams(48, 0.8 if sampled else 0.0, structured=spec)
        reqs.append(Request(str(i), list(ids), params, seq_seed=i))
        kind_of[str(i)] = kind
    cfg = JobConfig.model_validate(
        {
            "model": {"dtype": "float32"},
            # a small cache (preemption and recompute), small steps (chunked prefill), drafts on
            "engine": {
                # about 1,700 tokens: the admitted prompts fill it, so decoding preempts
                "kv_cache_bytes": 80_000_000,
                "max_batch_tokens": 2048,
                "max_num_seqs": 64,
                "speculative_tokens": 4,
            },
        }
    )
    engine = PagedEngine(model_f32, cfg)
    results = list(engine.generate(reqs))
    assert len(results) == 200
    for r in results:
        assert (r.finish_reason.value, r.structure) == ("stop", "complete"), (r.id, r.completion)
        check(kind_of[r.id], r.completion)
    assert engine.stats.preemptions > 0 and engine.stats.cached_tokens > 0
    assert engine.stats.draft_tokens == 0  # constrained rows never draft
    stats = engine.grammars.stats
    assert len(stats) == len(kinds) and sum(s.rows for s in stats.values()) == 200
