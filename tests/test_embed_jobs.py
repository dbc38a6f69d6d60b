"""Embed jobs end to end: OpenAI /v1/embeddings batch files, parquet and jsonl results, per-line
errors like the API's, dedup, resume after kill -9, and the job keys."""

from __future__ import annotations

import base64
import json
import struct

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from openai.types import CreateEmbeddingResponse

from jobrunner.config import load_job
from jobrunner.errors import ConfigError
from jobrunner.pipeline import run_job
from tests import crashkit
from tests.conftest import SAMPLES, write_job

EMB = "/v1/embeddings"


def line(cid, body, url=EMB):
    return json.dumps({"custom_id": cid, "method": "POST", "url": url, "body": body})


def batch_job(tmp_path, lines: list[str], **extra) -> object:
    src = tmp_path / "batch.jsonl"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    job = {
        "input": {"path": str(src), "format": "openai-batch", "max_error_rate": 1.0},
        "output": {"path": str(tmp_path / "out"), "format": "openai-batch"},
    }
    for key, value in extra.items():
        job[key] = {**job.get(key, {}), **value} if isinstance(value, dict) else value
    return load_job(write_job(tmp_path / "job.yaml", json.dumps(job)))


def output_lines(out) -> dict[str, dict]:
    rows = [json.loads(x) for x in (out / "output.jsonl").read_text().splitlines()]
    return {r["custom_id"]: r["response"]["body"] for r in rows}


def errors(out) -> dict[str, str]:
    path = out / "errors.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
    return {r["custom_id"]: r["code"] for r in rows}  # jobrunner's code (too_long: an HTTP 400)


def test_the_sample_embeddings_batch_validates_as_openai_responses(tmp_path):
    cfg = load_job(
        SAMPLES.parent.parent / "jobs" / "embed_openai.yaml",
        [f"output.path={tmp_path / 'out'}", f"input.path={SAMPLES / 'embeddings_batch.jsonl'}"],
    )
    assert cfg.task == "embed" and cfg.model.source == "all-minilm-l6-v2"  # implied by the lines
    summary = run_job(cfg)
    bodies = output_lines(tmp_path / "out")
    src = [json.loads(x) for x in (SAMPLES / "embeddings_batch.jsonl").read_text().splitlines()]
    assert set(bodies) == {x["custom_id"] for x in src}
    for x in src:
        body, asked = bodies[x["custom_id"]], x["body"]
        if asked.get("encoding_format") == "base64":
            raw = base64.b64decode(body["data"][0]["embedding"])
            vec = list(struct.unpack(f"<{len(raw) // 4}f", raw))
            body = {**body, "data": [{**body["data"][0], "embedding": vec}]}
        resp = CreateEmbeddingResponse.model_validate(body)
        inputs = asked["input"]
        n = len(inputs) if isinstance(inputs, list) and not isinstance(inputs[0], int) else 1
        assert [d.index for d in resp.data] == list(range(n))
        dims = asked.get("dimensions", 384)
        for d in resp.data:
            assert len(d.embedding) == dims
            assert sum(v * v for v in d.embedding) == pytest.approx(1.0, abs=1e-5)
        assert resp.usage.prompt_tokens == resp.usage.total_tokens > 0
    batch = json.loads((tmp_path / "out" / "batch.json").read_text())
    assert batch["endpoint"] == EMB
    assert batch["request_counts"] == {"total": 20, "completed": 20, "failed": 0}
    assert summary.rows["succeeded"] == 27  # one row per input: 4 + 4 + 2 in three lines


def test_bad_lines_fail_alone_like_the_api(tmp_path):
    long_text = "word " * 400  # over the model's 256 tokens
    lines = [
        line("ok", {"input": "a fine sentence"}),
        line("empty", {"input": ""}),
        line("empty-in-list", {"input": ["fine", ""]}),
        line("too-many", {"input": ["x"] * 2049}),
        line("too-long", {"input": long_text}),
        line("vocab", {"input": [101, 999999, 102]}),
        line("dims", {"input": "x", "dimensions": 0}),
        line("too-wide", {"input": "x", "dimensions": 5000}),  # the model's vectors: 384
        line("encoding", {"input": "x", "encoding_format": "int8"}),
        line("chat", {"messages": [{"role": "user", "content": "hi"}]}, url="/v1/chat/completions"),
    ]
    cfg = batch_job(tmp_path, lines, task="embed")
    run_job(cfg)
    out = tmp_path / "out"
    assert set(output_lines(out)) == {"ok"}
    assert errors(out) == {
        "empty": "empty_input",
        "empty-in-list": "empty_input",
        "too-many": "too_many_inputs",
        "too-long": "too_long",
        "vocab": "bad_body",
        "dims": "bad_body",
        "too-wide": "bad_body",
        "encoding": "bad_body",
        "chat": "unknown_endpoint",
    }


def test_a_line_asking_more_dimensions_than_the_model_has_is_one_error_line(tmp_path):
    """A line of several inputs fails once, under its own custom_id, as the API fails the
    request: not one error per input under ids the user never wrote."""
    lines = [
        line("ok", {"input": "x"}),
        line("wide", {"input": ["a", "b", "c"], "dimensions": 5000}),  # the model's: 384
    ]
    run_job(batch_job(tmp_path, lines, task="embed"))
    out = tmp_path / "out"
    rows = [json.loads(x) for x in (out / "errors.jsonl").read_text().splitlines()]
    assert [(r["custom_id"], r["error"]["code"], r["error"]["param"]) for r in rows] == [
        ("wide", "bad_body", "body.dimensions")
    ]
    assert "body.dimensions is 5000; the model's vectors have 384" in rows[0]["message"]
    batch = json.loads((out / "batch.json").read_text())
    assert batch["request_counts"] == {"total": 2, "completed": 1, "failed": 1}


def test_a_job_asking_more_dimensions_than_the_model_has_stops_before_any_row(tmp_path):
    lines = [line("a", {"input": "x"})]
    cfg = batch_job(tmp_path, lines, task="embed", embedding={"dimensions": 5000})
    with pytest.raises(ConfigError, match="embedding.dimensions is 5000.*384 values"):
        run_job(cfg)
    assert not (tmp_path / "out" / "output.jsonl").exists()
    # nothing was committed: the corrected job runs in the same run directory
    run_job(batch_job(tmp_path, lines, task="embed", embedding={"dimensions": 64}))
    assert len(output_lines(tmp_path / "out")["a"]["data"][0]["embedding"]) == 64
    with pytest.raises(ConfigError, match="holds a different job"):  # now it holds results
        run_job(batch_job(tmp_path, lines, task="embed", embedding={"dimensions": 32}))


def test_a_custom_id_like_another_lines_input_ids_fails_that_line_alone(tmp_path):
    """A line of several inputs keys them `<custom_id>#<index>`: a custom_id spelled like one
    of them, before or after, is a repeated id of that line, not a job failure."""
    lines = [
        line("e2#1", {"input": "first"}),
        line("e2", {"input": ["a", "b"]}),  # its inputs' ids: e2#0, e2#1
        line("f", {"input": ["c", "d"]}),
        line("f#0", {"input": "later"}),
    ]
    run_job(batch_job(tmp_path, lines, task="embed"))
    out = tmp_path / "out"
    assert set(output_lines(out)) == {"e2#1", "f"}
    assert errors(out) == {"e2": "duplicate_custom_id", "f#0": "duplicate_custom_id"}


def test_too_long_inputs_are_cut_when_the_job_says_so(tmp_path):
    lines = [line("long", {"input": "word " * 400})]
    run_job(batch_job(tmp_path, lines, input={"on_too_long": "truncate_right"}))
    body = output_lines(tmp_path / "out")["long"]
    assert body["usage"]["prompt_tokens"] == 256


def test_a_job_file_writes_a_fixed_size_embedding_column_and_dedups(tmp_path):
    rows = [{"id": f"r{i}", "text": t} for i, t in enumerate(["alpha beta", "gamma", "alpha beta"])]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "in.parquet")
    job = {
        "task": "embed",
        "input": {"path": str(tmp_path / "in.parquet"), "prompt": {"column": "text"}},
        "embedding": {"dimensions": 32},
        "output": {"path": str(tmp_path / "out")},
    }
    run_job(load_job(write_job(tmp_path / "job.yaml", json.dumps(job))))
    table = pa.concat_tables(pq.read_table(f) for f in (tmp_path / "out" / "results").glob("*"))
    assert table.schema.field("embedding").type == pa.list_(pa.float32(), 32)
    got = {r["id"]: r for r in table.to_pylist()}
    assert set(got) == {"r0", "r1", "r2"}
    assert got["r0"]["embedding"] == got["r2"]["embedding"] != got["r1"]["embedding"]
    assert got["r0"]["prompt_tokens"] == 4  # [CLS] alpha beta [SEP]
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["runs"][-1]["deduplicated"] == 1


def test_jsonl_results_hold_a_list_of_floats(tmp_path):
    (tmp_path / "in.jsonl").write_text('{"id": "a", "prompt": "hello"}\n')
    job = {
        "task": "embed",
        "input": {"path": str(tmp_path / "in.jsonl")},
        "embedding": {"normalize": False},
        "output": {"path": str(tmp_path / "out"), "format": "jsonl"},
    }
    run_job(load_job(write_job(tmp_path / "job.yaml", json.dumps(job))))
    (rec,) = crashkit.read_results(tmp_path / "out")
    assert len(rec["embedding"]) == 384 and all(isinstance(v, float) for v in rec["embedding"])
    assert sum(v * v for v in rec["embedding"]) != pytest.approx(1.0)  # not normalized


def test_kill9_then_rerun_gives_every_line_once(tmp_path):
    texts = [f"sentence number {i} about {crashkit.WORDS[i % 12]}" for i in range(14)]
    lines = [line(f"c{i}", {"input": t}) for i, t in enumerate(texts)]
    lines.insert(5, line("multi", {"input": texts[:3]}))
    (tmp_path / "ref").mkdir()
    run_job(batch_job(tmp_path / "ref", lines))
    expected = output_lines(tmp_path / "ref" / "out")
    (tmp_path / "run").mkdir()
    cfg = batch_job(tmp_path / "run", lines, output={"shard_rows": 4})
    job = tmp_path / "run" / "job.yaml"
    p = crashkit.run(job, JOBRUNNER_FAULT_KILL="after_shard:2")
    assert p.returncode == -9, p.stderr[-2000:]
    out = tmp_path / "run" / "out"
    assert 0 < len(crashkit.read_results(out)) < 17
    p = crashkit.run(job)
    assert p.returncode == 0, p.stderr[-2000:]
    crashkit.assert_each_row_once(out)
    got = output_lines(out)
    assert set(got) == set(expected) and len(got["multi"]["data"]) == 3
    for cid, body in expected.items():
        for a, b in zip(body["data"], got[cid]["data"], strict=True):
            assert a["embedding"] == pytest.approx(b["embedding"], abs=1e-6)
    assert cfg.task == "embed"


def test_embed_keys_are_checked_at_the_edge(tmp_path):
    cfg = load_job(write_job(tmp_path / "a.yaml", "task: embed\n"))
    assert cfg.model.source == "all-minilm-l6-v2" and cfg.embedding.normalize
    job = "task: embed\ninput:\n  prompt: {messages_column: messages}\n"
    with pytest.raises(ConfigError, match="messages_column"):
        load_job(write_job(tmp_path / "b.yaml", job))
    with pytest.raises(ConfigError, match="embedding.dimensions"):
        load_job(write_job(tmp_path / "c.yaml", "task: embed\nembedding: {dimensions: 0}\n"))
    generate = load_job(write_job(tmp_path / "d.yaml", "name: x\n"))
    assert generate.task == "generate" and "embed" not in generate.fingerprint_parts()
