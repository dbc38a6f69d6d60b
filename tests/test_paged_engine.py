"""The paged engine against HF transformers (the oracle), plus its failure paths.

Greedy float32 tokens must equal `model.generate` (batch 1) token for token.
"""

from __future__ import annotations

import pydoc_data.topics

import pytest
import torch

from jobrunner.config import JobConfig, ModelConfig
from jobrunner.engine.paged import cpu_kernels
from jobrunner.types import FinishReason, Request, SamplingParams

pytestmark = pytest.mark.slow

MAX_NEW = 16
QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain recursion to a child, with an example.",
    "List three prime numbers greater than 50.",
    "How do vaccines train the immune system?",
    "Translate 'good morning' into Spanish and German.",
    "Why is the sky blue?",
    "Give me a tip for writing clean Python code.",
    "What does HTTP status 404 mean?",
    "Summarize the plot of Romeo and Juliet in two sentences.",
    "What is the difference between a list and a tuple?",
    "Name a famous painting by Vincent van Gogh.",
]
SYSTEM = (
    "You are a meticulous assistant for a data team. Answer precisely, cite the relevant concept "
    "by name, prefer short paragraphs, never invent facts, and say when you are unsure. "
) * 4


@pytest.fixture(scope="module")
def loaded():
    from jobrunner.engine.loader import load_model

    torch.set_num_threads(2)
    return load_model(ModelConfig(dtype="float32"))


def chat_ids(tok, user: str, system: str | None = None) -> list[int]:
    msgs = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": user}
    ]
    ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
    return list(ids if isinstance(ids, list) else ids["input_ids"])


@pytest.fixture(scope="module")
def prompts(loaded) -> list[list[int]]:
    """32 real prompts: short questions, documentation texts of mixed length, shared heads."""
    tok = loaded.tokenizer
    topics = [pydoc_data.topics.topics[k] for k in sorted(pydoc_data.topics.topics)[:10]]
    docs = [f"Summarize this documentation:\n{t[: 150 + 120 * i]}" for i, t in enumerate(topics)]
    out = [chat_ids(tok, q) for q in QUESTIONS[:10]]
    out += [chat_ids(tok, d) for d in docs]
    out += [chat_ids(tok, q, SYSTEM) for q in QUESTIONS]
    return out


@pytest.fixture(scope="module")
def reference(loaded, prompts) -> list[list[int]]:
    refs = []
    for ids in prompts:
        out = loaded.model.generate(
            torch.tensor([ids]), max_new_tokens=MAX_NEW, do_sample=False, attention_mask=None
        )
        refs.append(out[0, len(ids) :].tolist())
    return refs


def make_engine(loaded, kv_bytes: int, **engine):
    from jobrunner.engine.paged import PagedEngine

    cfg = JobConfig()
    cfg.engine.kv_cache_bytes = kv_bytes
    for k, v in engine.items():
        setattr(cfg.engine, k, v)
    return PagedEngine(loaded, cfg)


def requests(prompts, **sampling) -> list[Request]:
    params = SamplingParams(max_new_tokens=MAX_NEW, **sampling)
    return [Request(str(i), ids, params) for i, ids in enumerate(prompts)]


def run(engine, reqs) -> dict[str, object]:
    return {r.id: r for r in engine.generate(reqs)}


def assert_matches(results, reference, rows=None):
    rows = range(len(reference)) if rows is None else rows
    bad = [i for i in rows if results[str(i)].token_ids != reference[i]]
    assert not bad, f"rows differing from HF generate: {bad}"


def test_greedy_matches_hf_with_chunks_and_prefix_hits(loaded, prompts, reference):
    engine = make_engine(loaded, 256 << 20, max_batch_tokens=256)
    m = engine.model  # chunks and prefix hits attend in the cache, in place, where it builds
    kernel = cpu_kernels.prefill_supported(m.num_heads, m.num_kv_heads, m.head_dim)
    assert engine.runner.prefill_kernel == kernel
    results = run(engine, requests(prompts))
    assert_matches(results, reference)
    shared = [results[str(i)].usage.cached_tokens for i in range(20, 32)]
    # the system prompt head is computed once: from the cache, or shared in the step that
    # computes it (sched/step_blocks.py)
    assert sum(c >= 96 for c in shared) >= 11, shared
    # the head goes on into part of a block (the chat template's user turn): those tokens are
    # copied from a cached block's K/V, not computed (BlockManager.cached_partial)
    assert sum(c % engine.block_manager.block_size != 0 for c in shared) >= 6, shared
    assert engine.block_manager.num_partial_tokens > 0
    assert engine.stats.cached_tokens == sum(r.usage.cached_tokens for r in results.values())
    generated = sum(r.usage.completion_tokens for r in results.values())
    assert engine.stats.generated_tokens == generated  # the live progress count, once per token
    r0 = results["0"]
    assert r0.usage.prompt_tokens == len(prompts[0])
    assert r0.usage.completion_tokens == len(r0.token_ids)
    assert r0.completion == loaded.tokenizer.decode(r0.token_ids, skip_special_tokens=True)
    log = engine.stats.step_log
    assert len(log) == engine.stats.steps and {"t", "kv_blocks_used"} <= set(log[0])


def test_greedy_matches_hf_when_every_chunk_behind_context_splits(
    loaded, prompts, reference, monkeypatch
):
    """Without the prefill kernel, small chunks behind cached context take one masked pass on
    CPU; force the two-pass split (the path of long chunks) on every one of them."""
    from jobrunner.engine.paged import runner

    monkeypatch.setattr(runner, "SPLIT_PREFILL_SCORES", 0)
    monkeypatch.setattr(cpu_kernels, "prefill_supported", lambda *a: False)
    engine = make_engine(loaded, 256 << 20, max_batch_tokens=256)
    assert engine.runner.decode_kernel and not engine.runner.prefill_kernel
    rows = list(range(1, 32, 2))
    results = run(engine, requests([prompts[i] for i in rows]))
    assert_matches({str(rows[int(k)]): v for k, v in results.items()}, reference, rows)


def test_greedy_matches_hf_on_the_torch_path_without_native_kernels(
    loaded, prompts, reference, monkeypatch
):

    monkeypatch.setenv("JOBRUNNER_CPU_KERNELS", "0")
    cpu_kernels.load.cache_clear()
    try:
        engine = make_engine(loaded, 256 << 20, max_batch_tokens=256)
        assert not engine.runner.decode_kernel and not engine.model.rope_kernel
        rows = list(range(0, 32, 3))
        results = run(engine, requests([prompts[i] for i in rows]))
    finally:
        monkeypatch.undo()
        cpu_kernels.load.cache_clear()
    assert_matches({str(rows[int(k)]): v for k, v in results.items()}, reference, rows)


def test_greedy_matches_hf_under_preemption(loaded, prompts, reference):
    rows = list(range(10, 32, 2))  # the longer prompts
    engine = make_engine(loaded, 400 * 46080)  # ~400 tokens of KV for 11 rows
    results = run(engine, requests([prompts[i] for i in rows]))
    assert engine.stats.preemptions > 0
    # recomputing a preempted row's tokens does not count them again
    assert engine.stats.generated_tokens == sum(r.usage.completion_tokens for r in results.values())
    remapped = {str(rows[int(k)]): v for k, v in results.items()}
    assert_matches(remapped, reference, rows)


def test_greedy_matches_hf_with_speculative_drafts(loaded, prompts, reference):
    """Drafts from n-gram lookup, checked by the model in the same step, change no token: rows
    attend as one decode query per token (kernel path) and keep what HF would have chosen."""
    engine = make_engine(loaded, 256 << 20, max_batch_tokens=256, speculative_tokens=4)
    results = run(engine, requests(prompts))
    assert_matches(results, reference)
    st = engine.stats
    assert st.accepted_draft_tokens > 0 and st.draft_tokens >= st.accepted_draft_tokens
    generated = sum(r.usage.completion_tokens for r in results.values())
    assert st.generated_tokens == generated


def test_speculative_drafts_on_the_torch_path_and_under_preemption(
    loaded, prompts, reference, monkeypatch
):
    """Without the native kernels a row with drafts attends as a chunk behind its context;
    with a small cache, drafts take no block that another row needs (they never preempt)."""
    rows = list(range(10, 32, 2))
    engine = make_engine(loaded, 400 * 46080, speculative_tokens=4)
    results = run(engine, requests([prompts[i] for i in rows]))
    assert engine.stats.preemptions > 0 and engine.stats.accepted_draft_tokens > 0
    assert_matches({str(rows[int(k)]): v for k, v in results.items()}, reference, rows)
    monkeypatch.setenv("JOBRUNNER_CPU_KERNELS", "0")
    cpu_kernels.load.cache_clear()
    try:
        engine = make_engine(loaded, 256 << 20, max_batch_tokens=256, speculative_tokens=4)
        assert not engine.runner.decode_kernel
        results = run(engine, requests([prompts[i] for i in rows]))
    finally:
        monkeypatch.undo()
        cpu_kernels.load.cache_clear()
    assert engine.stats.accepted_draft_tokens > 0
    assert_matches({str(rows[int(k)]): v for k, v in results.items()}, reference, rows)


@pytest.mark.parametrize(
    ("kv", "bytes_per_token", "min_same"), [("float16", 23040, 0.95), ("int8", 11880, 0.75)]
)
def test_a_smaller_kv_cache_is_read_by_the_kernel_and_stays_close_to_hf(
    loaded, prompts, reference, kv, bytes_per_token, min_same
):
    """model.kv_cache_dtype under a float32 model: the cache shrinks (46,080 bytes a token in
    float32), decode attention still reads it in place, and greedy tokens stay close to HF's
    (position by position; the float32 cache equals them exactly)."""
    from jobrunner.engine.quant.quality import exact_prefix

    cfg = JobConfig()
    cfg.model.kv_cache_dtype = kv
    cfg.engine.kv_cache_bytes = 256 << 20
    from jobrunner.engine.paged import PagedEngine

    engine = PagedEngine(loaded, cfg)
    assert engine.runner.decode_kernel and engine.stats.kv_bytes_per_token == bytes_per_token
    results = run(engine, requests(prompts))
    got = [results[str(i)].token_ids for i in range(len(prompts))]
    assert sum(g[0] == r[0] for g, r in zip(got, reference, strict=True)) >= len(prompts) - 1
    assert exact_prefix(reference, got, MAX_NEW) >= min_same


@pytest.fixture(scope="module")
def loaded_bf16():
    from jobrunner.engine.loader import load_model

    return load_model(ModelConfig(dtype="bfloat16"))


@pytest.mark.parametrize(
    ("kv", "model", "prefill_kernel", "draft"),
    [
        ("bfloat16", "float32", True, 0),
        ("int8", "float32", True, 0),
        ("fp8", "float32", True, 0),
        ("int8", "bfloat16", True, 0),  # prompts on the AMX tiles where the CPU has them
        ("int8", "float32", False, 0),  # prompts behind cached heads gathered by torch
        ("bfloat16", "float32", True, 2),  # draft tokens checked by the decode kernel
    ],
)
def test_slots_never_written_are_never_read(
    loaded, loaded_bf16, prompts, monkeypatch, kv, model, prefill_kernel, draft
):
    """On CPU the cache is allocated unwritten (no seconds of zeros at start-up, int8 and fp8
    too): a cache whose every slot holds NaN before the first step gives the same tokens as a
    zeroed one, chunked prompts and prefix hits included, so no path reads past what a sequence
    wrote (0 x NaN would be NaN)."""
    from jobrunner.engine.paged import PagedEngine

    source = loaded if model == "float32" else loaded_bf16
    if not prefill_kernel:
        monkeypatch.setattr(cpu_kernels, "prefill_supported", lambda *a: False)

    def tokens(fill) -> list[list[int]]:
        cfg = JobConfig()
        cfg.model.kv_cache_dtype = kv
        cfg.engine.kv_cache_bytes = 64 << 20
        cfg.engine.max_batch_tokens = 256
        cfg.engine.speculative_tokens = draft
        engine = PagedEngine(source, cfg)
        if not engine.runner.decode_kernel:
            pytest.skip("no native CPU kernels here: the cache is zeroed at allocation")
        assert engine.runner.prefill_kernel == prefill_kernel
        for pair in engine.kv.layers:
            for cache in pair:
                for t in (
                    (cache,) if isinstance(cache, torch.Tensor) else (cache.codes, cache.scales)
                ):
                    fill(t)
        results = run(engine, requests(prompts[:12]))
        assert engine.block_manager.num_hits > 0
        assert engine.stats.draft_tokens > 0 if draft else True
        return [results[str(i)].token_ids for i in range(12)]

    def poison(t: torch.Tensor) -> None:
        if t.dtype == torch.uint8:  # codes: any byte is a value; fp8 0x7f is NaN
            t.fill_(0x7F)
        else:
            t.fill_(float("nan"))

    assert tokens(poison) == tokens(lambda t: t.zero_())


def test_the_last_layer_runs_on_only_the_rows_whose_output_is_wanted(loaded, prompts, monkeypatch):
    """A prefill step's last layer writes every row's K/V but takes only the rows whose next
    token is sampled through o_proj and the MLP (and, under the CPU prefill kernel, attention):
    the same bits for those rows as running all of them, and none at all for a step of chunks
    that end before their prompts do."""
    from jobrunner.engine.embed.decoder import PagedPrefill
    from jobrunner.engine.paged import attention

    seqs = prompts[10:14]
    pp = PagedPrefill(loaded.model, 4096, 4096, 16)
    m, lens = pp.model, [len(s) for s in seqs]
    ids = torch.tensor([t for s in seqs for t in s])
    pos = torch.cat([torch.arange(n) for n in lens])
    wanted = torch.tensor(lens).cumsum(0) - 1  # each prompt's last token
    seen = []
    real = m._add_linear

    def spy(out, mod, x):
        if mod is m.layers[-1].mlp.down_proj or mod is m.layers[-1].self_attn.o_proj:
            seen.append(x.shape[0])
        return real(out, mod, x)

    monkeypatch.setattr(m, "_add_linear", spy)
    queries = []  # query rows of each prefill kernel call
    kernel = cpu_kernels.paged_prefill

    def counted(q, *args):
        queries.append(q.shape[0])
        return kernel(q, *args)

    monkeypatch.setattr(attention.cpu_kernels, "paged_prefill", counted)
    every = m.hidden_states(ids, pos, pp._metadata(lens), pp.kv.layers)
    assert seen == [sum(lens)] * 2
    seen.clear()
    queries.clear()
    got = m.hidden_states(ids, pos, pp._metadata(lens), pp.kv.layers, wanted)
    assert seen == [len(seqs)] * 2
    assert torch.equal(got, every[wanted])
    if pp.prefill_kernel:  # the last layer's four chunks attend for their last rows alone
        assert queries[-len(seqs) :] == [1] * len(seqs) and queries[: len(seqs)] == lens
    seen.clear()
    none = m.hidden_states(ids, pos, pp._metadata(lens), pp.kv.layers, wanted[:0])
    assert none.shape == (0, every.shape[1]) and seen == []


def test_the_real_model_runs_the_one_pass_norm_and_gated_silu(loaded, prompts, monkeypatch):
    """The model's own modules (transformers' SiLUActivation, LlamaRMSNorm) take the native
    one-pass kernels, not the torch fallbacks they are checked against."""
    from jobrunner.engine.paged import model as paged_model

    calls = {"silu_mul": 0, "rms_norm": 0}
    for name in calls:
        real = getattr(cpu_kernels, name)

        def spy(*args, _real=real, _name=name):
            calls[_name] += 1
            return _real(*args)

        monkeypatch.setattr(cpu_kernels, name, spy)
    monkeypatch.setattr(paged_model.F, "silu", lambda *a, **k: pytest.fail("torch SiLU ran"))
    engine = make_engine(loaded, 64 << 20)
    run(engine, requests(prompts[:2]))
    layers = len(engine.model.layers)
    # one prefill step (the two rows share their head within it) through every layer
    assert calls["silu_mul"] >= layers and calls["rms_norm"] >= 2 * layers, calls


def test_injected_oom_backs_off_and_retries(loaded, prompts, reference, monkeypatch):
    monkeypatch.setenv("JOBRUNNER_FAULT_OOM_STEPS", "2,3")
    engine = make_engine(loaded, 256 << 20)
    results = run(engine, requests(prompts[:6]))
    assert engine.stats.oom_retries == 2
    assert engine.scheduler.max_num_seqs < 256
    assert_matches(results, reference, range(6))


def test_a_native_kernel_out_of_memory_backs_off_too(loaded, prompts, reference, monkeypatch):
    """A native kernel's failed allocation (MemoryError) is an out-of-memory like torch's: the
    step backs off and is retried, and rows that shared blocks in it start again."""
    from jobrunner.engine.paged import attention

    kernel, calls = cpu_kernels.paged_prefill, []

    def failing_once(*args):
        calls.append(1)
        if len(calls) == 1:
            raise MemoryError("paged_prefill: out of memory (injected)")
        return kernel(*args)

    monkeypatch.setattr(attention.cpu_kernels, "paged_prefill", failing_once)
    engine = make_engine(loaded, 256 << 20)
    if not engine.runner.prefill_kernel:
        pytest.skip("no native prefill kernel here")
    results = run(engine, requests(prompts[20:26]))  # one system prompt: rows share blocks
    assert engine.stats.oom_retries == 1
    assert_matches(results, reference[20:26], range(6))


def test_a_copy_of_a_partial_head_out_of_memory_backs_off(loaded, prompts, reference):
    """The copies of partial prefix hits run inside the step's retries: one that runs out of
    memory backs the step off, and the rows it was for start again."""
    engine = make_engine(loaded, 256 << 20, max_batch_tokens=256)
    copy, failed = engine.runner.copy_heads, []

    def failing_once(copies):
        if copies and not failed:
            failed.append(list(copies))
            raise torch.OutOfMemoryError("copy_heads (injected)")
        copy(copies)

    engine.runner.copy_heads = failing_once
    results = run(engine, requests(prompts[20:32]))  # one system prompt: partial hits
    assert failed and engine.stats.oom_retries == 1
    assert_matches(results, reference[20:32], range(12))


def test_limits_grow_back_after_clean_steps(loaded, prompts, reference, monkeypatch):
    import jobrunner.engine.paged.engine as paged_engine

    monkeypatch.setenv("JOBRUNNER_FAULT_OOM_STEPS", "2,3")
    monkeypatch.setattr(paged_engine, "GROW_BACK_STEPS", 2)
    engine = make_engine(loaded, 256 << 20, max_num_seqs=8, max_batch_tokens=512)
    results = run(engine, requests(prompts[:6]))
    assert engine.stats.oom_retries == 2
    assert (engine.scheduler.max_num_seqs, engine.scheduler.max_batch_tokens) == (8, 512)
    assert_matches(results, reference, range(6))


def test_oom_on_a_single_short_row_fails_it(loaded, prompts, monkeypatch):
    monkeypatch.setenv("JOBRUNNER_FAULT_OOM_STEPS", ",".join(str(i) for i in range(1, 40)))
    engine = make_engine(loaded, 64 << 20, max_num_seqs=1, max_batch_tokens=16)
    (result,) = run(engine, requests(prompts[:1])).values()
    assert result.finish_reason is FinishReason.ERROR and result.error_code == "oom"


def test_nan_logits_fail_only_that_row(loaded, prompts, reference, monkeypatch):
    engine = make_engine(loaded, 256 << 20)
    forward = engine.model.forward

    def poisoned(*args, **kw):
        logits = forward(*args, **kw).clone()
        if engine.stats.steps == 3:
            logits[0] = float("nan")
        return logits

    monkeypatch.setattr(engine.model, "forward", poisoned)
    results = run(engine, requests(prompts[:4]))
    bad = [r for r in results.values() if not r.ok]
    assert len(bad) == 1 and bad[0].error_code == "nan_logits"
    good = [i for i in range(4) if results[str(i)].ok]
    assert_matches(results, reference, good)


def test_stop_string_is_cut_and_excluded(loaded, prompts, reference):
    tok = loaded.tokenizer
    text = tok.decode(reference[0], skip_special_tokens=True)
    stop = text.split()[2]
    engine = make_engine(loaded, 256 << 20)
    results = run(engine, requests(prompts[:3], stop=(stop,)))
    r = results["0"]
    assert r.finish_reason is FinishReason.STOP
    assert r.completion == text[: text.index(stop)]
    assert stop not in r.completion
    assert r.token_ids == reference[0][: len(r.token_ids)]


def test_seeded_sampling_ignores_batch_neighbours(loaded, prompts):
    params = dict(temperature=0.8, top_p=0.9, top_k=50)
    target = Request("t", prompts[1], SamplingParams(max_new_tokens=MAX_NEW, **params), seq_seed=7)
    alone = run(make_engine(loaded, 256 << 20), [target])["t"].token_ids
    crowd = requests(prompts[4:9], **params) + [target]
    together = run(make_engine(loaded, 256 << 20), crowd)["t"].token_ids
    assert alone == together and len(alone) > 0


def test_pulls_requests_lazily_and_honours_stop(loaded, prompts):
    pulled = []

    def stream():
        for i in range(1000):
            pulled.append(i)
            yield Request(str(i), prompts[i % 12], SamplingParams(max_new_tokens=4))

    engine = make_engine(loaded, 256 << 20, max_num_seqs=4)
    gen = engine.generate(stream())
    next(gen)
    assert len(pulled) <= 2 * 4 + 4 + 1
    engine.request_stop()
    rest = list(gen)
    assert len(rest) < 20 and len(pulled) < 30
    assert engine.stats.engine_seconds > 0 and engine.stats.busy_fraction > 0


def test_a_stop_abandons_a_long_step_between_layers(loaded, prompts):
    """Promise 7 on a slow CPU: a stop requested while a big prefill step runs does not wait for
    its last layer (minutes for a large model); the step is dropped and no row of it is emitted."""
    engine = make_engine(loaded, 256 << 20)
    layers_run = []
    attention = engine.model._attention

    def counting(i, *args):
        layers_run.append(i)
        if len(layers_run) == 3:
            engine.request_stop()  # as the signal handler does, mid-step
        return attention(i, *args)

    engine.model._attention = counting
    results = run(engine, requests(prompts))
    assert layers_run == [0, 1, 2]  # the check before layer 3 ended the step
    assert results == {}  # the only step was a prefill: nothing finished, nothing half-done
    assert list(engine.generate(iter(requests(prompts)))) == []  # a stopped engine stays stopped


def test_rejects_prompts_that_cannot_fit(loaded):
    engine = make_engine(loaded, 256 << 20)
    reqs = [Request("empty", [], SamplingParams()), Request("long", [1] * 5000, SamplingParams())]
    results = run(engine, reqs)
    assert results["empty"].error_code == "empty_prompt"
    assert results["long"].error_code == "prompt_too_long"
    assert "(the model's context, " in results["long"].error  # 256 MB of cache holds more
    small = make_engine(loaded, 1 << 20)  # 1 MB of cache: fewer tokens than the context
    (result,) = run(small, [Request("long", [1] * 5000, SamplingParams())]).values()
    assert "the KV cache holds" in result.error and "engine.kv_cache_bytes" in result.error


def test_supports_names_unknown_architectures(loaded):
    from jobrunner.engine.paged.model import unsupported_reason

    class Fake:
        class config:  # noqa: N801
            model_type = "gpt2"

    assert unsupported_reason(loaded.model, 2048) is None
    assert "gpt2" in unsupported_reason(Fake, 2048)


@pytest.mark.parametrize("given", [None, 5000])
def test_steps_spend_the_cpu_default_budget_unless_one_is_given(loaded, prompts, given):
    """engine.max_batch_tokens unset: a CPU's steps take at most 4,096 tokens (config.py); a
    given budget is spent as given."""
    text = [t for p in prompts for t in p]
    rows = [Request(str(i), text[i : i + 1500], SamplingParams(max_new_tokens=2)) for i in range(4)]
    engine = make_engine(loaded, 256 << 20, max_batch_tokens=given)
    results = run(engine, rows)
    assert all(not r.error_code for r in results.values())
    widest = max(step["batch_tokens"] for step in engine.stats.step_log)
    assert widest == (given or 4096)
