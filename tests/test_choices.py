"""Choices on the real model: logprobs against HF's logits, n seeded samples, penalties against
HF generate, and the OpenAI output shape of all of them."""

from __future__ import annotations

import pytest
import torch

from jobrunner.config import JobConfig
from jobrunner.engine.paged import PagedEngine
from jobrunner.engine.static import StaticEngine
from jobrunner.formats.openai_batch.output import chat_body, completion_body
from jobrunner.io.writers import result_record
from jobrunner.types import Request, SamplingParams

pytestmark = pytest.mark.slow

TEXTS = ["Name three colours.", "What is a Python list?"]


def chat_ids(tok, text: str) -> list[int]:
    msgs = [{"role": "user", "content": text}]
    return list(
        tok.apply_chat_template(msgs, add_generation_prompt=True, return_dict=True)["input_ids"]
    )


def paged(model, **engine) -> PagedEngine:
    cfg = JobConfig()
    cfg.engine.kv_cache_bytes = 64 << 20
    for k, v in engine.items():
        setattr(cfg.engine, k, v)
    return PagedEngine(model, cfg)


def run(engine, reqs) -> dict:
    return {r.id: r for r in engine.generate(reqs)}


@pytest.fixture(scope="module")
def ids(model_f32):
    return [chat_ids(model_f32.tokenizer, t) for t in TEXTS]


@pytest.mark.parametrize("kind", ["paged", "static"])
def test_greedy_logprobs_are_log_softmax_of_hf_logits(model_f32, ids, kind):
    sp = SamplingParams(max_new_tokens=6, logprobs=True, top_logprobs=5)
    reqs = [Request(str(i), p, sp) for i, p in enumerate(ids)]
    engine = paged(model_f32) if kind == "paged" else StaticEngine(model_f32, JobConfig())
    results = run(engine, reqs)
    for i, p in enumerate(ids):
        c = results[str(i)].choices[0]
        assert len(c.logprobs) == len(c.token_ids) == 6
        with torch.no_grad():
            out = model_f32.model(torch.tensor([p + c.token_ids])).logits[0].float()
        ref = torch.log_softmax(out[len(p) - 1 : -1], -1)  # (6, V): the logits each token came from
        for t, e in enumerate(c.logprobs):
            assert e.token_id == c.token_ids[t]
            assert e.logprob == pytest.approx(float(ref[t, e.token_id]), abs=1e-4)
            top = ref[t].topk(5)
            assert [a.token_id for a in e.top_logprobs] == top.indices.tolist()
            assert [a.logprob for a in e.top_logprobs] == pytest.approx(
                top.values.tolist(), abs=1e-4
            )
            assert (
                e.token == model_f32.tokenizer.decode([e.token_id])
                and bytes(e.bytes).decode() == e.token
            )


def test_n_seeded_samples_reproduce_across_runs_and_neighbours(model_f32, ids):
    sp = SamplingParams(max_new_tokens=8, temperature=1.0, n=3)
    target = Request("t", ids[0], sp, seq_seed=42)
    alone = run(paged(model_f32), [target])["t"]
    crowd = [
        Request("x", ids[1], sp, seq_seed=7),
        Request("t", ids[0], sp, seq_seed=42),
        Request("y", ids[0], SamplingParams(max_new_tokens=5, temperature=0.7), seq_seed=3),
    ]
    together = run(paged(model_f32, max_num_seqs=3), crowd)["t"]
    texts = [c.token_ids for c in alone.choices]
    assert [c.index for c in alone.choices] == [0, 1, 2]
    assert [c.token_ids for c in together.choices] == texts
    assert len(set(map(tuple, texts))) > 1  # each sample has its own generator
    single = run(
        paged(model_f32),
        [Request("t", ids[0], SamplingParams(max_new_tokens=8, temperature=1.0), seq_seed=42)],
    )
    assert single["t"].token_ids == texts[0]  # sample 0 is the row's n = 1 sample
    assert alone.usage.completion_tokens == sum(len(t) for t in texts)
    assert alone.usage.prompt_tokens == len(ids[0])


def test_greedy_n_is_one_computation_with_n_identical_choices(model_f32, ids):
    engine = paged(model_f32)
    r = run(engine, [Request("g", ids[0], SamplingParams(max_new_tokens=6, n=3))])["g"]
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert len({tuple(c.token_ids) for c in r.choices}) == 1
    assert engine.stats.generated_tokens == len(r.token_ids)
    assert r.usage.completion_tokens == 3 * len(r.token_ids)


@pytest.mark.parametrize("kind", ["paged", "static"])
def test_repetition_penalty_matches_hf_generate(model_f32, ids, kind):
    sp = SamplingParams(max_new_tokens=12, repetition_penalty=1.5)
    engine = (
        paged(model_f32, speculative_tokens=3)
        if kind == "paged"
        else StaticEngine(model_f32, JobConfig())
    )
    got = run(engine, [Request(str(i), p, sp) for i, p in enumerate(ids)])
    for i, p in enumerate(ids):
        out = model_f32.model.generate(
            torch.tensor([p]), max_new_tokens=12, do_sample=False, repetition_penalty=1.5
        )
        assert got[str(i)].token_ids == out[0, len(p) :].tolist()
    assert kind == "static" or engine.stats.draft_tokens == 0  # penalised rows get no drafts


def test_min_tokens_and_logit_bias_shape_the_output(model_f32, ids):
    tok = model_f32.tokenizer
    plain = run(paged(model_f32), [Request("a", ids[0], SamplingParams(max_new_tokens=4))])["a"]
    first = plain.token_ids[0]
    sp = SamplingParams(max_new_tokens=4, logit_bias=((first, -100.0),), min_tokens=4)
    r = run(paged(model_f32), [Request("a", ids[0], sp)])["a"]
    assert r.token_ids[0] != first and len(r.token_ids) == 4
    assert not set(r.token_ids) & set(model_f32.eos_token_ids)
    assert r.completion == tok.decode(r.token_ids, skip_special_tokens=True)


def test_openai_bodies_carry_n_choices_and_logprobs(model_f32, ids):
    from openai.types import Completion
    from openai.types.chat import ChatCompletion

    sp = SamplingParams(max_new_tokens=5, temperature=0.8, n=2, logprobs=True, top_logprobs=2)
    r = run(paged(model_f32), [Request("q", ids[0], sp, seq_seed=1)])["q"]
    rec = result_record(r, "m")
    assert [c["index"] for c in rec["choices"]] == [0, 1]
    assert len(rec["logprobs"]) == len(r.choices[0].token_ids)
    chat = ChatCompletion.model_validate(chat_body(rec, "x", 0))
    assert [c.message.content for c in chat.choices] == [c.text for c in r.choices]
    lp = chat.choices[1].logprobs.content
    assert [e.logprob for e in lp] == [e.logprob for e in r.choices[1].logprobs]
    assert len(lp[0].top_logprobs) == 2
    legacy = Completion.model_validate(completion_body(rec, "x", 0))
    assert legacy.choices[0].logprobs.tokens == [e.token for e in r.choices[0].logprobs]
    assert chat.usage.completion_tokens == sum(len(c.token_ids) for c in r.choices)


def test_a_registered_processor_runs_on_every_row_of_the_engine(model_f32, ids, monkeypatch):
    """The recipe of docs/DESIGN.md: a factory attaches a processor to each row it wants."""
    from test_logits_processors import BanToken

    from jobrunner.engine import sampler

    plain = run(paged(model_f32), [Request("a", ids[0], SamplingParams(max_new_tokens=4))])["a"]
    bans: dict[str, BanToken] = {}

    def factory(req: Request):
        if req.id == "a":
            return bans.setdefault(req.id, BanToken(plain.token_ids[0]))
        return None

    monkeypatch.setattr(sampler, "PROCESSOR_FACTORIES", [factory])
    reqs = [
        Request("a", ids[0], SamplingParams(max_new_tokens=4)),
        Request("b", ids[0], SamplingParams(max_new_tokens=4)),
    ]
    got = run(paged(model_f32, speculative_tokens=2), reqs)
    assert got["a"].token_ids[0] != plain.token_ids[0]
    assert got["b"].token_ids == plain.token_ids  # its neighbour has no processor
    assert bans["a"].accepted == got["a"].token_ids  # accept() heard every kept token


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_a_job_file_writes_n_choices_and_logprobs_as_list_columns(tmp_path, fmt):
    """The documented layout: one row per input row; `choices` and `logprobs` list columns;
    usage and cost count every sample."""
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq
    from typer.testing import CliRunner

    from jobrunner.cli import app

    data = tmp_path / "in.jsonl"
    data.write_text(
        "".join(json.dumps({"id": f"r{i}", "prompt": t}) + "\n" for i, t in enumerate(TEXTS))
    )
    job = tmp_path / "job.yaml"
    job.write_text(
        f"""
model: {{source: smollm2-135m-instruct, dtype: float32}}
input: {{path: {data}}}
generation: {{max_new_tokens: 4, temperature: 0.8, n: 2, logprobs: true, top_logprobs: 2,
              repetition_penalty: 1.1, seed: 3}}
output: {{path: {tmp_path / "out"}, format: {fmt}}}
engine: {{kv_cache_bytes: 50000000}}
"""
    )
    result = CliRunner().invoke(app, ["run", str(job)])
    assert result.exit_code == 0, result.output
    rows = []  # a slow machine may commit the two rows in two shards (output.shard_seconds)
    for shard in sorted((tmp_path / "out" / "results").glob(f"part-*.{fmt}")):
        if fmt == "parquet":
            rows += pq.read_table(shard).to_pylist()
        else:
            rows += [json.loads(x) for x in shard.read_text().splitlines()]
    assert sorted(r["id"] for r in rows) == ["r0", "r1"]
    for r in rows:
        assert [c["index"] for c in r["choices"]] == [0, 1]
        assert r["completion"] == r["choices"][0]["text"]
        assert r["completion_tokens"] == sum(c["completion_tokens"] for c in r["choices"])
        assert r["cost_usd"] > 0
        for c in r["choices"]:
            assert len(c["logprobs"]) == c["completion_tokens"]
            assert all(len(e["top_logprobs"]) == 2 and e["logprob"] <= 0 for e in c["logprobs"])
        assert r["logprobs"] == r["choices"][0]["logprobs"]
    if fmt == "parquet":
        assert pa.types.is_list(pq.read_schema(shard).field("choices").type)
