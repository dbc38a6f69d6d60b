"""OpenAI Batch API files in, Batch-API-shaped files out, parsed by the official `openai` types."""

from __future__ import annotations

import gzip
import json
import logging

import pytest
from openai.types import Batch, BatchError, Completion
from openai.types.chat import ChatCompletion
from typer.testing import CliRunner

from jobrunner.cli import app
from jobrunner.config import JobConfig, ModelConfig
from jobrunner.engine.static import sampling_groups
from jobrunner.formats import make_preparer, read_rows
from jobrunner.formats.openai_batch.body import parse_line
from jobrunner.formats.openai_batch.output import error_record, output_line
from jobrunner.formats.openai_batch.prepare import OpenAIPreparer
from jobrunner.formats.openai_batch.read import BatchLineError
from jobrunner.prep.render import RenderError
from jobrunner.resume import scan_ids
from jobrunner.types import Request, RowError, RowRef, SamplingParams
from tests.conftest import write_job

CHAT, COMPL = "/v1/chat/completions", "/v1/completions"
DEFAULTS = SamplingParams(max_new_tokens=128, temperature=0.0, top_p=1.0, seed=0)


def line(cid, url, body, method="POST"):
    return {"custom_id": cid, "method": method, "url": url, "body": body}


def chat(text, **kw):
    return {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": text}], **kw}


def write_lines(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write((r if isinstance(r, str) else json.dumps(r)) + "\n")
    return path


# ------------------------------------------------------------------ body parsing (no model)


TOOL_HISTORY = [  # an assistant turn of tool calls (content null), then the tool's answer
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "w", "arguments": "{}"}}
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
]


def render(messages, where=None):
    return "|".join(m["role"] + ":" + m["content"] for m in messages)


def test_body_fields_become_per_line_sampling_params():
    got = parse_line(
        line("a", CHAT, chat("hi", max_tokens=7, temperature=0.5, top_p=0.9, stop="END", seed=42)),
        DEFAULTS,
        render,
    )
    assert got.sampling == SamplingParams(
        max_new_tokens=7, temperature=0.5, top_p=0.9, seed=42, stop=("END",)
    )
    assert got.text == "user:hi" and got.seed == 42 and got.model == "gpt-4o-mini"
    got = parse_line(
        line(
            "b",
            COMPL,
            {"prompt": "x", "max_tokens": 9, "max_completion_tokens": 4, "stop": ["a", "b"]},
        ),
        DEFAULTS,
        render,
    )
    assert (got.endpoint, got.text, got.sampling.max_new_tokens, got.sampling.stop) == (
        COMPL,
        "x",
        4,
        ("a", "b"),
    )
    assert got.sampling.temperature == 0.0 and got.seed is None  # omitted: the job's values
    got = parse_line(
        line("c", COMPL, {"prompt": [[1, 2, 3]], "n": 1, "logprobs": None}), DEFAULTS, render
    )
    assert got.token_ids == [1, 2, 3]


@pytest.mark.parametrize(
    "values, code, field",
    [
        (line("a", "/v1/embeddings", {"input": "x"}), "unknown_endpoint", "url"),
        (line("a", CHAT, chat("x"), method="GET"), "bad_method", "method"),
        (line("a", CHAT, "not an object"), "bad_body", "body"),
        (line("a", CHAT, {"model": "m"}), "bad_body", "body.messages"),
        (line("a", CHAT, chat("x", n=0)), "bad_body", "body.n"),
        (line("a", CHAT, chat("x", top_logprobs=2)), "bad_body", "body.top_logprobs"),
        (
            line("a", CHAT, chat("x", logprobs=True, top_logprobs=21)),
            "bad_body",
            "body.top_logprobs",
        ),
        (line("a", COMPL, {"prompt": "x", "logprobs": 30}), "bad_body", "body.logprobs"),
        (line("a", CHAT, chat("x", logit_bias={"a": 1})), "bad_body", "body.logit_bias"),
        (line("a", CHAT, chat("x", logit_bias={"5": 101})), "bad_body", "body.logit_bias"),
        (line("a", CHAT, chat("x", presence_penalty=3)), "bad_body", "body.presence_penalty"),
        (line("a", CHAT, chat("x", repetition_penalty=0)), "bad_body", "body.repetition_penalty"),
        (line("a", CHAT, chat("x", stop_token_ids=[-1])), "bad_body", "body.stop_token_ids"),
        (line("a", CHAT, chat("x", best_of=2)), "unsupported", "body.best_of"),
        (line("a", CHAT, chat("x", temperature="hot")), "bad_body", "body.temperature"),
        (line("a", CHAT, chat("x", max_tokens=0)), "bad_body", "body.max_tokens"),
        (line("a", CHAT, chat("x", stop=[1])), "bad_body", "body.stop"),
        (line("a", COMPL, {"prompt": ["p", "q"]}), "bad_body", "body.prompt"),
        (line("a", COMPL, {"prompt": "  "}), "empty_prompt", "body.prompt"),
        (line("a", CHAT, {"messages": TOOL_HISTORY}), "unsupported", "body.messages[1].tool_calls"),
    ],
)
def test_bad_lines_are_rejected_with_code_and_field(values, code, field):
    with pytest.raises(RenderError) as e:
        parse_line(values, DEFAULTS, render)
    assert (e.value.code, e.value.field) == (code, field)


def test_duplicate_custom_ids_are_line_errors_not_a_job_failure(tmp_path):
    data = write_lines(
        tmp_path / "b.jsonl",
        [
            line("x", CHAT, chat("a")),
            line("y", CHAT, chat("b")),
            line("x", CHAT, chat("c")),
            {"method": "POST"},
        ],
    )
    cfg = JobConfig.model_validate({"input": {"path": str(data), "format": "openai-batch"}})
    assert scan_ids(cfg) == (4, {})  # the pre-scan does not fail the job
    prep = make_preparer(cfg, tokenizer=None)
    ids = [prep.row_id(r) for r in read_rows(str(data), "openai-batch")]
    assert ids[:2] == ["x", "y"]
    assert (ids[2].code, ids[2].id, ids[2].custom_id, ids[2].source.line) == (
        "duplicate_custom_id",
        "b.jsonl:2",
        "x",
        3,
    )
    assert ids[2].message.endswith(
        "custom_id 'x' is used by an earlier line, b.jsonl:line 1 (custom_ids must be unique)"
    )
    assert (ids[3].code, ids[3].id, ids[3].custom_id) == ("missing_custom_id", "b.jsonl:3", None)


def test_a_repeated_custom_id_names_the_earlier_file_and_line(tmp_path):
    """Across the files of a directory, the repeat names where the id was first used: the
    file as derived ids name it (relative to the input root) and its line."""
    for d in ("in/2024", "in/2025", "emb"):
        (tmp_path / d).mkdir(parents=True)
    write_lines(tmp_path / "in/2024/a.jsonl", [line("x", CHAT, chat("a"))])
    write_lines(
        tmp_path / "in/2025/a.jsonl", ["", line("y", CHAT, chat("b")), line("x", CHAT, chat("c"))]
    )
    embed = "/v1/embeddings"
    write_lines(tmp_path / "emb/1.jsonl", [line("e#1", embed, {"input": "r"})])
    write_lines(tmp_path / "emb/2.jsonl", [line("e", embed, {"input": ["p", "q"]})])  # e#0, e#1
    for folder, task, want in (
        ("in", "generate", "custom_id 'x' is used by an earlier line, 2024/a.jsonl:line 1 ("),
        (
            "emb",
            "embed",
            "'e#1', the id of one of this line's inputs, is used by an earlier line,"
            " 1.jsonl:line 1; rename",
        ),
    ):
        inp = {"path": str(tmp_path / folder), "format": "openai-batch"}
        prep = make_preparer(JobConfig.model_validate({"input": inp, "task": task}), None)
        *_, repeat = [prep.row_id(r) for r in read_rows(inp["path"], "openai-batch")]
        assert repeat.code == "duplicate_custom_id"
        assert want in repeat.message, repeat.message


def test_a_line_refused_for_a_lone_surrogate_keeps_its_custom_id(tmp_path):
    """The JSON parses, so the user's custom_id names the error line (the row id stays the
    line's derived id); a custom_id that is itself not text cannot, and is not used."""
    body = '{"messages": [{"role": "user", "content": "bad \\ud800 x"}]}'
    data = write_lines(
        tmp_path / "b.jsonl",
        [
            f'{{"custom_id": "surr", "method": "POST", "url": "{CHAT}", "body": {body}}}',
            f'{{"custom_id": "\\udc00", "method": "POST", "url": "{CHAT}", "body": {body}}}',
        ],
    )
    recs = [error_record(e) for e in read_rows(str(data), "openai-batch")]
    assert [(r["id"], r["custom_id"], r["error"]["code"]) for r in recs] == [
        ("b.jsonl:0", "surr", "invalid_unicode"),
        ("b.jsonl:1", "b.jsonl:1", "invalid_unicode"),
    ]


def test_error_lines_have_the_batch_api_shape_and_jobrunner_fields():
    e = BatchLineError(
        "duplicate_custom_id",
        "dup",
        RowRef("b.jsonl", 2, line=3),
        "b.jsonl:2",
        "custom_id",
        custom_id="x",
    )
    rec = error_record(e)
    assert list(rec)[:4] == ["id", "custom_id", "response", "error"]
    assert (rec["id"], rec["custom_id"], rec["response"], rec["line"], rec["code"]) == (
        "b.jsonl:2",
        "x",
        None,
        3,
        "duplicate_custom_id",
    )
    err = BatchError.model_validate(rec["error"])
    assert (err.code, err.line, err.param, err.message) == (
        "duplicate_custom_id",
        3,
        "custom_id",
        "dup",
    )
    engine_failure = error_record(
        RowError("oom", "out of memory", RowRef("b.jsonl", 0, line=1), "y")
    )
    assert engine_failure["custom_id"] == "y"


def test_output_usage_has_the_token_details_openai_bodies_have():
    """Code written for OpenAI's output reads `usage.completion_tokens_details.reasoning_tokens`
    (and the prompt's `audio_tokens`): present, and zero, on both endpoints' bodies."""
    rec = {"id": "a", "completion": "hi", "finish_reason": "stop", "model": "m"}
    rec |= {"prompt_tokens": 7, "completion_tokens": 2, "cached_tokens": 4}
    for url, kind in ((CHAT, ChatCompletion), (COMPL, Completion)):
        body = output_line({**rec, "url": url}, "salt", 0)["response"]["body"]
        usage = kind.model_validate(body).usage
        assert (usage.total_tokens, usage.prompt_tokens_details.cached_tokens) == (9, 4)
        details = body["usage"]["completion_tokens_details"]
        assert details == {
            "reasoning_tokens": 0,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        }
        assert body["usage"]["prompt_tokens_details"]["audio_tokens"] == 0


def test_static_engine_batches_only_lines_generate_can_share():
    def req(i, **kw):
        return Request(str(i), [1], SamplingParams(**kw))

    reqs = [
        req(0),
        req(1, stop=("\n",)),
        req(2, max_new_tokens=3),
        req(3, temperature=0.7),
        req(4, stop=("\n",), temperature=0.0),
    ]
    assert [[r.id for r in g] for g in sampling_groups(reqs)] == [["0", "2"], ["1", "4"], ["3"]]


# ------------------------------------------------------------------ with the real tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    from jobrunner.engine.loader import load_tokenizer

    return load_tokenizer(ModelConfig())


def test_chat_uses_the_template_completions_the_raw_prompt(tmp_path, tokenizer, caplog):
    msgs = [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Hi?"}]
    data = write_lines(
        tmp_path / "b.jsonl",
        [
            line(
                "c", CHAT, {"model": "gpt-4o-mini", "messages": msgs, "seed": 5, "temperature": 1.0}
            ),
            line(
                "p", COMPL, {"model": "gpt-4o-mini", "prompt": "Once upon a time", "max_tokens": 3}
            ),
            line("t", COMPL, {"model": "other", "prompt": [5, 6, 7], "user": "u1", "store": True}),
            line("v", COMPL, {"prompt": [10**9]}),
        ],
    )
    cfg = JobConfig.model_validate(
        {
            "input": {"path": str(data), "format": "openai-batch"},
            "generation": {"max_new_tokens": 11},
        }
    )
    prep = make_preparer(cfg, tokenizer)
    assert isinstance(prep, OpenAIPreparer)
    with caplog.at_level(logging.WARNING, logger="jobrunner.formats.openai_batch.prepare"):
        c, p, t, v = prep.prepare(read_rows(str(data), "openai-batch"))
    templated = tokenizer.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, msgs[1]],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert c.prompt_token_ids == tokenizer(templated, add_special_tokens=False)["input_ids"]
    assert c.prompt.startswith("<|im_start|>system\nBe brief.")
    assert p.prompt_token_ids == tokenizer("Once upon a time")["input_ids"]
    assert t.prompt_token_ids == [5, 6, 7]
    assert (v.code, v.field) == ("bad_body", "body.prompt")
    assert (c.sampling.max_new_tokens, c.sampling.temperature, c.seq_seed) == (11, 1.0, 5)
    assert (p.sampling.max_new_tokens, p.meta["endpoint"], c.meta["endpoint"]) == (3, COMPL, CHAT)
    assert p.columns == {
        "method": "POST",
        "url": COMPL,
        "body": json.loads(data.read_text().splitlines()[1])["body"],
        "tool_call": None,
    }
    warnings = [r for r in caplog.records if "differs from the job's model" in r.getMessage()]
    assert len(warnings) == 1
    unused = sorted(
        r.getMessage().split("body.")[1].split()[0]
        for r in caplog.records
        if "is not used" in r.getMessage()
    )
    assert unused == ["store", "user"]


# ------------------------------------------------------------------ end to end, real model


def run_cli(*args):
    result = CliRunner().invoke(app, list(args))
    summary = json.loads(result.stdout.strip().splitlines()[-1]) if result.stdout.strip() else None
    return result.exit_code, summary


MIXED = [
    line("chat-1", CHAT, chat("What is a tuple in Python?", max_tokens=6)),
    line(
        "compl-1",
        COMPL,
        {"model": "gpt-4o-mini", "prompt": "The capital of France is", "max_tokens": 5},
    ),
    line("chat-long", CHAT, chat("Explain Python decorators in detail.", max_completion_tokens=3)),
    line("bad-url", "/v1/embeddings", {"model": "m", "input": "x"}),
    line("chat-1", CHAT, chat("Duplicate id.", max_tokens=4)),
    "{not json",
    line("n-two", CHAT, chat("Hi", n=2)),
    line("compl-2", COMPL, {"prompt": ["def add(a, b):"], "max_tokens": 8, "stop": "\n\n"}),
    line("logprobs", COMPL, {"prompt": "x", "logprobs": 2}),
]


@pytest.fixture(scope="module")
def batch_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("openai_batch")
    data = write_lines(tmp / "requests.jsonl", MIXED)
    job = write_job(
        tmp / "job.yaml",
        f"""
model: {{source: smollm2-135m-instruct}}
input: {{path: {data}, format: openai-batch}}
output: {{path: {tmp / "out"}, format: openai-batch}}
""",
    )
    args = [
        "run",
        str(job),
        "--set",
        "model.dtype=float32",
        "--set",
        "input.max_error_rate=0.9",
        "--set",
        "engine.kv_cache_bytes=50000000",
    ]
    code, summary = run_cli(*args)
    return tmp / "out", args, code, summary


def read_jsonl(path):
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


@pytest.mark.slow
def test_one_output_or_error_line_per_input_line(batch_run):
    out, _, code, summary = batch_run
    assert code == 0
    assert summary["rows"] == {"succeeded": 6, "failed": 3, "skipped": 0}
    outputs, errors = read_jsonl(out / "output.jsonl"), read_jsonl(out / "errors.jsonl")
    assert sorted(o["custom_id"] for o in outputs) == [
        "chat-1",
        "chat-long",
        "compl-1",
        "compl-2",
        "logprobs",
        "n-two",
    ]
    assert len(outputs) + len(errors) == len(MIXED)
    got = {(e["custom_id"], e["error"]["line"], e["error"]["code"]) for e in errors}
    assert got == {
        ("bad-url", 4, "unknown_endpoint"),
        ("chat-1", 5, "duplicate_custom_id"),
        ("requests.jsonl:5", 6, "malformed_json"),
    }
    for e in errors:
        assert e["response"] is None and BatchError.model_validate(e["error"]).line == e["line"]


@pytest.mark.slow
def test_a_gzipped_batch_file_is_detected_and_answers_as_the_plain_one(batch_run, tmp_path):
    """`input.path: requests.jsonl.gz`, format auto: every line answered as the plain file's,
    bad lines on the same line numbers, under the same derived ids."""
    out, args, _, _ = batch_run
    packed = tmp_path / "requests.jsonl.gz"
    packed.write_bytes(gzip.compress((out.parent / "requests.jsonl").read_bytes()))
    job = write_job(
        tmp_path / "job.yaml",
        f"""
model: {{source: smollm2-135m-instruct}}
input: {{path: {packed}}}
output: {{path: {tmp_path / "out"}, format: openai-batch}}
""",
    )
    code, summary = run_cli("run", str(job), *args[2:])
    assert code == 0, summary
    assert summary["rows"] == {"succeeded": 6, "failed": 3, "skipped": 0}

    def answers(d):
        outputs = [
            (o["custom_id"], o["response"]["body"]["choices"])
            for o in read_jsonl(d / "output.jsonl")
        ]
        errors = [
            (e["custom_id"], e["error"]["line"], e["error"]["code"])
            for e in read_jsonl(d / "errors.jsonl")
        ]
        return sorted(outputs, key=repr), sorted(errors)

    assert answers(tmp_path / "out") == answers(out)


@pytest.mark.slow
def test_output_lines_parse_with_the_openai_types(batch_run, tokenizer):
    out = batch_run[0]
    by_id = {o["custom_id"]: o for o in read_jsonl(out / "output.jsonl")}
    for cid, kind in (
        ("chat-1", ChatCompletion),
        ("chat-long", ChatCompletion),
        ("compl-1", Completion),
        ("compl-2", Completion),
    ):
        o = by_id[cid]
        assert o["error"] is None and o["response"]["status_code"] == 200
        body = kind.model_validate(o["response"]["body"])
        assert body.object == ("chat.completion" if kind is ChatCompletion else "text_completion")
        u = body.usage
        assert u.total_tokens == u.prompt_tokens + u.completion_tokens
        assert u.prompt_tokens_details.cached_tokens >= 0
        assert len(body.choices) == 1 and body.choices[0].finish_reason in ("stop", "length")
    chat_long = ChatCompletion.model_validate(by_id["chat-long"]["response"]["body"])
    assert (chat_long.usage.completion_tokens, chat_long.choices[0].finish_reason) == (3, "length")
    assert chat_long.choices[0].message.content  # three tokens of an explanation
    compl = Completion.model_validate(by_id["compl-1"]["response"]["body"])
    assert compl.usage.prompt_tokens == len(tokenizer("The capital of France is")["input_ids"])
    assert compl.usage.completion_tokens <= 5
    two = ChatCompletion.model_validate(by_id["n-two"]["response"]["body"])
    assert [c.index for c in two.choices] == [0, 1]  # greedy: n copies of one computation
    assert two.choices[0].message.content == two.choices[1].message.content
    scored = Completion.model_validate(by_id["logprobs"]["response"]["body"]).choices[0].logprobs
    assert len(scored.tokens) == len(scored.token_logprobs) == len(scored.top_logprobs) > 0
    assert all(
        len(alts) <= 2 and lp <= 0
        for alts, lp in zip(scored.top_logprobs, scored.token_logprobs, strict=True)
    )


@pytest.mark.slow
def test_batch_summary_costs_and_report_agree_with_the_lines(batch_run):
    out = batch_run[0]
    batch = Batch.model_validate(json.loads((out / "batch.json").read_text()))
    assert (
        batch.status,
        batch.request_counts.total,
        batch.request_counts.completed,
        batch.request_counts.failed,
    ) == ("completed", 9, 6, 3)
    bodies = [o["response"]["body"] for o in read_jsonl(out / "output.jsonl")]
    assert batch.usage.input_tokens == sum(b["usage"]["prompt_tokens"] for b in bodies)
    assert batch.usage.output_tokens == sum(b["usage"]["completion_tokens"] for b in bodies)
    shard_rows = [r for f in sorted((out / "results").iterdir()) for r in read_jsonl(f)]
    assert all(r["cost_usd"] > 0 and r["url"] in (CHAT, COMPL) for r in shard_rows)
    report = json.loads((out / "report.json").read_text())
    assert report["rows"]["succeeded"] == 6 and report["rows"]["failed"] == 3
    assert report["tokens"]["completion"] == batch.usage.output_tokens
    assert float(batch.metadata["cost_usd"]) == pytest.approx(
        sum(r["cost_usd"] for r in shard_rows)
    )


@pytest.mark.slow
def test_rerun_does_nothing_and_reassembly_is_exact(batch_run):
    out, args, _, _ = batch_run
    before = {p.name: p.read_bytes() for p in (out / "output.jsonl", out / "errors.jsonl")}
    code, summary = run_cli(*args)
    assert (code, summary["status"]) == (0, "nothing_to_do")
    assert all((out / name).read_bytes() == b for name, b in before.items())
    # Interrupted just before the end: every line is committed, so nothing is generated again,
    # no error line is written twice, and output.jsonl is assembled again byte for byte.
    (out / "_SUCCESS").unlink()
    (out / "output.jsonl").unlink()
    code, summary = run_cli(*args)
    assert (code, summary["rows"]) == (0, {"succeeded": 6, "failed": 3, "skipped": 9})
    assert all((out / name).read_bytes() == b for name, b in before.items())
    # skipped counts the rows the latest run found committed, not a sum over every resume
    (out / "_SUCCESS").unlink()
    code, summary = run_cli(*args)
    assert (code, summary["rows"]) == (0, {"succeeded": 6, "failed": 3, "skipped": 9})
    # a finished run whose assembled files or a report were deleted: the rerun makes them again
    made = {n: (out / n).read_bytes() for n in ("output.jsonl", "batch.json", "report.md")}
    for name in made:
        (out / name).unlink()
    code, summary = run_cli(*args)
    assert (code, summary["status"]) == (0, "nothing_to_do")
    assert {n: (out / n).read_bytes() for n in made} == made


@pytest.mark.slow
def test_static_engine_honours_each_lines_own_params_in_one_call(model_f32):
    from jobrunner.config import JobConfig
    from jobrunner.engine.static import StaticEngine

    tok = model_f32.tokenizer

    def chat_ids(text):
        return tok(
            tok.apply_chat_template(
                [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
            ),
            add_special_tokens=False,
        )["input_ids"]

    # "a" has the shortest prompt, so it leads its batch: its stop string must not cut the others.
    reqs = [
        Request("a", chat_ids("Hi."), SamplingParams(max_new_tokens=8, stop=(" ",))),
        Request("b", chat_ids("Explain why the sky is blue."), SamplingParams(max_new_tokens=6)),
        Request(
            "c",
            chat_ids("Say something about cats."),
            SamplingParams(max_new_tokens=5, temperature=0.8),
            seq_seed=3,
        ),
    ]
    engine = StaticEngine(model_f32, JobConfig())
    together = {r.id: r for r in engine.generate(reqs)}
    for r in reqs:
        alone = next(iter(StaticEngine(model_f32, JobConfig()).generate([r])))
        got = together[r.id]
        assert (got.token_ids, got.completion, got.finish_reason) == (
            alone.token_ids,
            alone.completion,
            alone.finish_reason,
        )
    assert " " not in together["a"].completion and together["a"].finish_reason.value == "stop"
    assert (together["b"].usage.completion_tokens, together["b"].finish_reason.value) == (
        6,
        "length",
    )


def test_the_format_modules_import_no_torch():
    import subprocess
    import sys

    code = "import sys, jobrunner.formats, jobrunner.io.rundir; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_sampling_fields_of_openai_and_vllm_bodies_are_honoured():
    body = chat(
        "x",
        n=3,
        logprobs=True,
        top_logprobs=4,
        presence_penalty=0.5,
        frequency_penalty=-0.5,
        logit_bias={"11": -100, "7": 2.5},
        top_k=-1,
        min_p=0.1,
        repetition_penalty=1.2,
        min_tokens=2,
        stop_token_ids=[5],
        temperature=0.7,
    )
    got = parse_line(line("a", CHAT, body), SamplingParams(top_k=9), render).sampling
    assert got == SamplingParams(
        temperature=0.7,
        n=3,
        logprobs=True,
        top_logprobs=4,
        presence_penalty=0.5,
        frequency_penalty=-0.5,
        logit_bias=((7, 2.5), (11, -100.0)),
        top_k=0,
        min_p=0.1,
        repetition_penalty=1.2,
        min_tokens=2,
        stop_token_ids=(5,),
    )
    legacy = parse_line(line("a", COMPL, {"prompt": "p", "logprobs": 3}), DEFAULTS, render)
    assert (legacy.sampling.logprobs, legacy.sampling.top_logprobs) == (True, 3)
