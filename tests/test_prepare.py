"""Rows become Requests or per-row errors: ids, rendering, tokenization, length policy."""

from __future__ import annotations

import pytest

from jobrunner.config import JobConfig
from jobrunner.io.readers import RawRow
from jobrunner.prep.prepare import Preparer, renamed_input_columns, row_seed
from jobrunner.prep.render import RenderError, template_fields
from jobrunner.types import Request, RowError, RowRef, SamplingParams


def cfg(**input_kw) -> JobConfig:
    c = JobConfig()
    for k, v in input_kw.items():
        setattr(c.input, k, v)
    return c


def raw(values, row=0, file="in.jsonl"):
    return RawRow(values, RowRef(file, row, line=row + 1))


def test_text_prompt_goes_through_the_chat_template(tokenizer):
    (req,) = Preparer(cfg(), tokenizer).prepare_batch([raw({"id": 1, "prompt": "Hi there"})])
    assert isinstance(req, Request)
    assert req.id == "1"
    assert req.prompt.startswith("<|im_start|>system") and "Hi there" in req.prompt
    assert req.prompt_token_ids == tokenizer(req.prompt, add_special_tokens=False)["input_ids"]


def test_template_and_system_prompt(tokenizer):
    c = cfg(
        prompt={"template": "Summarize: {text}"}, system_prompt="Be brief.", use_chat_template=False
    )
    (req,) = Preparer(c, tokenizer).prepare_batch([raw({"id": "a", "text": "cats"})])
    assert req.prompt == "Be brief.\n\nSummarize: cats"


def test_messages_column_accepts_lists_and_json_text(tokenizer):
    msgs = [{"role": "user", "content": "What is 2+2?"}]
    c = cfg(prompt={"messages_column": "messages"})
    a, b = Preparer(c, tokenizer).prepare_batch(
        [
            raw({"id": "a", "messages": msgs}),
            raw({"id": "b", "messages": '[{"role": "user", "content": "What is 2+2?"}]'}, 1),
        ]
    )
    assert a.prompt_token_ids == b.prompt_token_ids
    assert a.prompt.endswith("<|im_start|>assistant\n")


@pytest.mark.parametrize(
    "values, code, field",
    [
        ({"id": "a", "prompt": "   "}, "empty_prompt", "prompt"),
        ({"id": "a"}, "missing_field", "prompt"),
        ({"id": "a", "prompt": 5}, "bad_type", "prompt"),
        ({"id": None, "prompt": "x"}, "missing_id", "id"),
        ({"id": [1], "prompt": "x"}, "bad_type", "id"),
    ],
)
def test_bad_rows_become_errors_naming_the_field(tokenizer, values, code, field):
    first = raw({"id": "ok", "prompt": "fine"})
    ok, (err,) = (
        Preparer(cfg(), tokenizer).prepare_batch([first])[0],
        Preparer(cfg(), tokenizer).prepare_batch([first, raw(values, 3)])[1:],
    )
    assert isinstance(ok, Request)
    assert isinstance(err, RowError)
    assert (err.code, err.field, err.source.line) == (code, field, 4)
    assert "in.jsonl:line 4" in err.message


def test_too_long_policy(tokenizer):
    long = {"id": "a", "prompt": "word " * 400}
    c = cfg(use_chat_template=False)
    c.model.max_model_len = 64
    (err,) = Preparer(c, tokenizer).prepare_batch([raw(long)])
    assert err.code == "too_long" and "on_too_long" in err.message
    assert "model.max_model_len 64" in err.message  # the setting to raise, by its full name
    c.input.on_too_long = "truncate_left"
    (req,) = Preparer(c, tokenizer).prepare_batch([raw(long)])
    assert req.num_prompt_tokens == 63 and req.sampling.max_new_tokens == 1


def test_ids_are_derived_when_the_file_has_none(tokenizer):
    a, b = Preparer(cfg(), tokenizer).prepare_batch(
        [raw({"prompt": "x"}, 0, "d/f.jsonl"), raw({"prompt": "y"}, 1, "d/f.jsonl")]
    )
    assert (a.id, b.id) == ("f.jsonl:0", "f.jsonl:1")


def test_row_seed_depends_on_row_and_job_seed_only():
    assert row_seed(0, "a") == row_seed(0, "a")
    assert len({row_seed(0, "a"), row_seed(0, "b"), row_seed(1, "a")}) == 3


def test_template_fields_name_columns_whole_and_run_no_code(tokenizer):
    assert template_fields("x {a} {b}") == ["a", "b"]
    assert template_fields("{a.__class__} {a[0]} {Review Text}") == [
        "a.__class__",
        "a[0]",
        "Review Text",
    ]
    with pytest.raises(RenderError):
        template_fields("{}")
    c = cfg(prompt={"template": "{a.__class__}|{a[0]}|{Review Text!r:>6}|{{a}}"})
    c.input.use_chat_template = False
    values = {"id": "1", "a": "xyz", "a.__class__": "k", "a[0]": "i", "Review Text": "ok"}
    (req,) = Preparer(c, tokenizer).prepare_batch([raw(values)])
    assert req.prompt == "k|i|  'ok'|{a}"  # each column's own value: no attribute, no index
    (err,) = Preparer(c, tokenizer).prepare_batch([raw({"id": "1", "a": "xyz"})])
    assert isinstance(err, RowError) and err.code == "missing_field"


def test_the_dedup_key_tells_apart_rows_differing_in_any_sampling_field():
    import dataclasses

    from jobrunner.prep.stream import dedup_key

    base = SamplingParams()
    changed = {
        "max_new_tokens": 7,
        "top_p": 0.5,
        "top_k": 3,
        "seed": 1,
        "stop": ("x",),
        "ignore_eos": True,
        "min_p": 0.1,
        "presence_penalty": 0.5,
        "frequency_penalty": 0.5,
        "repetition_penalty": 1.2,
        "logit_bias": ((1, 2.0),),
        "min_tokens": 2,
        "stop_token_ids": (4,),
        "n": 2,
        "logprobs": True,
        "top_logprobs": 2,
        "structured": ("json_object",),
    }
    fields = {f.name for f in dataclasses.fields(SamplingParams)} - {"temperature"}
    assert set(changed) == fields  # a new field must be added here (and distinguish rows)
    key = dedup_key(Request("a", [1, 2], base))
    assert dedup_key(Request("c", [1, 2], SamplingParams())) == key  # an equal row, its own object
    assert dedup_key(Request("d", [1, 2, 0], base)) != key
    assert dedup_key(Request("e", [1, 2], base, meta={"dimensions": 8})) != key
    for name, value in changed.items():
        other = dedup_key(Request("b", [1, 2], dataclasses.replace(base, **{name: value})))
        assert other is not None and other != key, name


def test_input_columns_named_like_result_columns_keep_every_value():
    cols = {"prompt": "hi", "completion": "gold", "input_completion": "mine", "model": "m"}
    assert renamed_input_columns(cols) == {
        "prompt": "hi",
        "input_input_completion": "gold",
        "input_completion": "mine",
        "input_model": "m",
    }


def test_nested_template_values_are_json_not_python_repr(tokenizer, tmp_path):
    """A list, struct or map column in a template reads as JSON: no single quotes, None or
    datetime.datetime(...) from Python's repr, a map as an object."""
    import datetime

    import pyarrow as pa
    import pyarrow.parquet as pq

    from jobrunner.formats import read_rows

    table = pa.table(
        {
            "id": [1],
            "tags": [["a", None]],
            "meta": [{"when": datetime.datetime(2024, 1, 2, 3, 4), "ok": True}],
            "attrs": pa.array([[("size", 3)]], pa.map_(pa.string(), pa.int64())),
        }
    )
    pq.write_table(table, tmp_path / "a.parquet")
    c = cfg(prompt={"template": "{tags}|{meta}|{attrs}"}, use_chat_template=False)
    (req,) = Preparer(c, tokenizer).prepare_batch(list(read_rows(str(tmp_path / "a.parquet"))))
    assert req.prompt == '["a", null]|{"when": "2024-01-02 03:04:00", "ok": true}|{"size": 3}'
