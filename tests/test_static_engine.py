"""The static engine: length-sorted token-budgeted batches, exact greedy output, per-row seeds."""

from __future__ import annotations

from jobrunner.config import JobConfig
from jobrunner.engine.static import StaticEngine, pack_batches
from jobrunner.types import Request, SamplingParams


def req(i, n, new=8, **kw):
    return Request(
        f"r{i}", list(range(1, n + 1)), SamplingParams(max_new_tokens=new, **kw), seq_seed=i
    )


def test_pack_batches_sorts_and_respects_budgets():
    reqs = [req(0, 50), req(1, 10), req(2, 30), req(3, 12), req(4, 11)]
    batches = pack_batches(reqs, max_batch_tokens=64, max_num_seqs=2)
    assert [[r.id for r in b] for b in batches] == [["r1", "r4"], ["r3"], ["r2"], ["r0"]]
    for b in batches:
        width = max(r.num_prompt_tokens for r in b) + 8
        assert len(b) == 1 or len(b) * width <= 64


def prompts(tokenizer, texts):
    return [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": t}],
            tokenize=True,
            add_generation_prompt=True,
            return_dict=True,
        )["input_ids"]
        for t in texts
    ]


TEXTS = [
    "What is a Python list?",
    "Name three colours.",
    "Explain in one sentence why the sky looks blue to people standing on the ground at noon.",
]


def test_greedy_equals_hf_generate_one_row_at_a_time(model_f32):
    import torch

    tok = model_f32.tokenizer
    ids = prompts(tok, TEXTS)
    reqs = [Request(f"r{i}", p, SamplingParams(max_new_tokens=12)) for i, p in enumerate(ids)]
    results = {r.id: r for r in StaticEngine(model_f32, JobConfig()).generate(reqs)}
    for i, p in enumerate(ids):
        out = model_f32.model.generate(torch.tensor([p]), max_new_tokens=12, do_sample=False)
        expected = out[0, len(p) :].tolist()
        if 2 in expected:
            expected = expected[: expected.index(2) + 1]  # the EOS that ended it is kept
        assert results[f"r{i}"].token_ids == expected


def test_sampling_is_per_row_reproducible_whatever_the_batch(model_f32):
    tok = model_f32.tokenizer
    ids = prompts(tok, TEXTS)
    sp = SamplingParams(max_new_tokens=10, temperature=0.9, top_p=0.9, top_k=50)
    alone = next(
        iter(StaticEngine(model_f32, JobConfig()).generate([Request("x", ids[0], sp, seq_seed=7)]))
    )
    together = [
        Request("x", ids[0], sp, seq_seed=7),
        Request("y", ids[1], sp, seq_seed=8),
        Request("z", ids[2], sp, seq_seed=9),
    ]
    got = {r.id: r for r in StaticEngine(model_f32, JobConfig()).generate(together)}
    assert got["x"].token_ids == alone.token_ids


def test_a_stop_ends_generate_at_the_next_token_and_drops_the_batch(model_f32):
    """Promise 7: a SIGTERM does not wait for a batch's max_new_tokens; the batch cut short
    gives no result (its rows are unfinished and rerun), and no further batch runs."""
    ids = prompts(model_f32.tokenizer, TEXTS)
    sp = SamplingParams(max_new_tokens=40, ignore_eos=True)
    engine = StaticEngine(model_f32, JobConfig())
    calls = []

    def stop_at_third_forward(module, args, output):
        calls.append(1)
        if len(calls) == 3:
            engine.request_stop()

    hook = model_f32.model.register_forward_hook(stop_at_third_forward)
    try:
        results = list(engine.generate([Request(f"r{i}", p, sp) for i, p in enumerate(ids)]))
    finally:
        hook.remove()
    assert results == []
    assert len(calls) == 3  # not 40: generate() ended at the token after the request


def test_dequantized_gguf_cache_is_a_plain_hf_checkpoint(model_f32):
    """Other tools (vLLM, plain transformers) read the cache: the tied head is stored the HF way,
    as the input embeddings, and the directory loads without jobrunner to the same logits."""
    import torch
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    path = f"{model_f32.weights_dir}/model.safetensors"
    with safe_open(path, "pt") as f:
        names = set(f.keys())
    assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names
    plain = AutoModelForCausalLM.from_pretrained(model_f32.weights_dir, dtype=torch.float32)
    ids = torch.tensor([[1, 4093, 314, 260, 3575, 282, 4649, 47]])
    with torch.inference_mode():
        assert torch.equal(plain(ids).logits, model_f32.model(ids).logits)


def test_constrained_rows_match_the_paged_engine_token_for_token(model_f32):
    """A model only the static engine runs gets structured outputs too: each row masked by
    its own grammar in a shared generate() batch, with unconstrained rows beside it and rows of
    other lengths (one cut by its own max_new_tokens mid-value). Greedy float32: the same
    tokens, text and verdict as the paged engine, which masks the same logits."""
    import json

    from jobrunner.engine.paged import PagedEngine
    from jobrunner.structured.spec import choice_spec, regex_spec, schema_spec

    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 8}, "n": {"type": "integer"}},
        "required": ["name", "n"],
    }
    specs = [
        (schema_spec(schema, "schema"), 40),
        (choice_spec(["question", "summary", "explanation"], "choice"), 40),
        (regex_spec(r"[A-Z][a-z]{2,8} [0-9]{1,3}", "regex"), 40),
        (schema_spec(schema, "schema"), 3),  # cut short: length, incomplete
        (None, 12),
    ]
    ids = prompts(model_f32.tokenizer, TEXTS)
    reqs = [
        Request(f"r{i}", ids[i % len(ids)], SamplingParams(new, structured=spec))
        for i, (spec, new) in enumerate(specs)
    ]
    cfg = JobConfig.model_validate({"model": {"dtype": "float32"}})
    static = {r.id: r for r in StaticEngine(model_f32, cfg).generate(reqs)}
    paged = {r.id: r for r in PagedEngine(model_f32, cfg).generate(reqs)}
    for rid, want in paged.items():
        got = static[rid]
        assert (got.token_ids, got.completion, got.structure, got.finish_reason) == (
            want.token_ids,
            want.completion,
            want.structure,
            want.finish_reason,
        ), rid
    assert [static[f"r{i}"].structure for i in range(5)] == [
        "complete",
        "complete",
        "complete",
        "incomplete",
        None,
    ]
    assert json.loads(static["r0"].completion)["name"]
    assert static["r3"].finish_reason.value == "length"


def test_a_spec_that_does_not_compile_fails_its_row_only(model_f32):
    from jobrunner.structured.spec import OutputSpec

    ids = prompts(model_f32.tokenizer, TEXTS)
    bad = OutputSpec("json_schema", '{"type": "objectx"}', where="body.response_format")
    reqs = [
        Request("bad", ids[0], SamplingParams(8, structured=bad)),
        Request("ok", ids[1], SamplingParams(8)),
    ]
    got = {r.id: r for r in StaticEngine(model_f32, JobConfig()).generate(reqs)}
    assert got["bad"].error_code == "bad_schema" and "body.response_format" in got["bad"].error
    assert got["ok"].error_code is None and got["ok"].token_ids


def test_a_row_ended_by_a_stop_string_counts_the_tokens_the_paged_engine_counts(model_f32):
    """generate() pads a row after its stop string: the padding (an EOS id here) was kept as
    the row's last token, one completion token more than the paged engine's, and paid for."""
    from jobrunner.engine.paged import PagedEngine

    ids = prompts(model_f32.tokenizer, TEXTS)
    sp = SamplingParams(max_new_tokens=24, stop=(".", ","))
    reqs = [Request(f"r{i}", p, sp) for i, p in enumerate(ids)]
    cfg = JobConfig.model_validate({"model": {"dtype": "float32"}})
    static = {r.id: r for r in StaticEngine(model_f32, cfg).generate(reqs)}
    paged = {r.id: r for r in PagedEngine(model_f32, cfg).generate(reqs)}
    assert any(r.finish_reason.value == "stop" for r in paged.values())
    for rid, want in paged.items():
        got = static[rid]
        assert (got.token_ids, got.completion, got.finish_reason) == (
            want.token_ids,
            want.completion,
            want.finish_reason,
        ), rid
        assert got.usage.completion_tokens == want.usage.completion_tokens
