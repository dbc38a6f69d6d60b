"""A bfloat16 model on a CPU with AVX-512 BF16: bfloat16 weights through our kernel, float32
activations, a bfloat16 KV cache; closer to float32 than HF's own bfloat16 run."""

from __future__ import annotations

import pytest
import torch
from stepkit import native_calls, several_steps, swap_reaches_native_steps, tokens_and_logprobs

from jobrunner.config import JobConfig, ModelConfig
from jobrunner.engine.paged import cpu_kernels
from jobrunner.engine.quant.quality import exact_prefix
from jobrunner.types import Request, SamplingParams

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not cpu_kernels.gemm_bf16_supported(), reason="no AVX-512 BF16 here"),
]

MAX_NEW = 16
PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain recursion to a child, with an example.",
    "How do vaccines train the immune system?",
    "Why is the sky blue?",
    "Give me a tip for writing clean Python code.",
    "Summarize the plot of Romeo and Juliet in two sentences.",
    "What is the difference between a list and a tuple in Python? Explain with care.",
]


def load(dtype: str):
    from jobrunner.engine.loader import load_model

    torch.set_num_threads(2)
    return load_model(ModelConfig(dtype=dtype))


@pytest.fixture(scope="module")
def models():
    return load("float32"), load("bfloat16")


@pytest.fixture(scope="module")
def prompts(models) -> list[list[int]]:
    tok = models[0].tokenizer
    out = []
    for q in PROMPTS:
        ids = tok.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True
        )
        out.append(list(ids if isinstance(ids, list) else ids["input_ids"]))
    return out


def hf_greedy(loaded, prompts) -> list[list[int]]:
    outs = []
    for ids in prompts:
        out = loaded.model.generate(
            torch.tensor([ids]), max_new_tokens=MAX_NEW, do_sample=False, attention_mask=None
        )
        outs.append(out[0, len(ids) :].tolist())
    return outs


def paged_greedy(loaded, prompts) -> tuple[object, list[list[int]]]:
    from jobrunner.engine.paged import PagedEngine

    cfg = JobConfig()
    cfg.engine.kv_cache_bytes = 64 << 20
    engine = PagedEngine(loaded, cfg)
    params = SamplingParams(max_new_tokens=MAX_NEW)
    reqs = [Request(str(i), ids, params) for i, ids in enumerate(prompts)]
    results = {r.id: r for r in engine.generate(reqs)}
    return engine, [results[str(i)].token_ids for i in range(len(prompts))]


def test_bfloat16_weights_run_our_kernel_with_float32_rows_and_a_bfloat16_cache(
    models, prompts, monkeypatch
):
    calls = []
    real = cpu_kernels.small_gemm_bf16
    monkeypatch.setattr(
        cpu_kernels, "small_gemm_bf16", lambda *a: calls.append(a[0].shape[0]) or real(*a)
    )
    engine, _ = paged_greedy(models[1], prompts[:2])
    assert engine.model.dtype == torch.bfloat16 and engine.model.act_dtype == torch.float32
    assert engine.kv.layers[0][0].dtype == torch.bfloat16
    assert len(calls) > len(engine.model.layers)  # q/k/v of each layer and lm_head, prefill
    assert engine.model.native is not None  # decode steps: the same kernels in one call


def test_bfloat16_tokens_are_closer_to_float32_than_hf_bfloat16s(models, prompts):
    """The float32 oracle (HF generate in float32) against HF's bfloat16 generate and against
    ours: float32 activations lose less than bfloat16 ones, position by position."""
    reference = hf_greedy(models[0], prompts)
    hf_bf16 = hf_greedy(models[1], prompts)
    _, ours = paged_greedy(models[1], prompts)
    assert exact_prefix(reference, ours, MAX_NEW) >= exact_prefix(reference, hf_bf16, MAX_NEW)
    assert sum(o[0] == r[0] for o, r in zip(ours, reference, strict=True)) >= len(prompts) - 1


def test_rows_rounded_where_made_and_residuals_added_in_the_linears_keep_every_bit(
    models, prompts, amx, monkeypatch
):
    """The norms before q/k/v and gate/up, and the fused gate/up product, hand their linears
    bfloat16 rows (read in place, on AMX tiles or vdpbf16ps) instead of float32 rows each
    linear rounds, and o_proj and down add into the residual stream as they go: every token and
    log-probability is the same to the bit as with the rounding off and each linear's output
    written and then added, prompts of one step and of several, with the switch on and off."""
    from jobrunner.engine.paged import PagedEngine
    from jobrunner.engine.paged.small_linear import SmallRowLinear

    rounded, fused = [], [True]  # fused[0]: this run rounds where made and adds in the kernel
    real, real_add, real_gated = (
        SmallRowLinear.rounded,
        SmallRowLinear.add_,
        SmallRowLinear.silu_gated,
    )
    monkeypatch.setattr(
        SmallRowLinear,
        "rounded",
        lambda self, x, *a: rounded.append(x.shape[1]) or real(self, x, *a),
    )

    taken = []  # the fused kernels that ran (not declined)
    real_kernel_add = cpu_kernels.small_gemm_bf16_add_

    def kernel_add(*a):
        added = real_kernel_add(*a)
        return taken.append("add") or added if added else added

    def add_(self, y, x, w, b):
        if fused[0]:
            return real_add(self, y, x, w, b)
        y += self(x.float(), w, b)  # the linear written out, then added

    def silu_gated(self, *a):  # off: the float32 product written out and rounded inside down
        gated = real_gated(self, *a) if fused[0] else None
        return gated if gated is None else taken.append("silu") or gated

    monkeypatch.setattr(cpu_kernels, "small_gemm_bf16_add_", kernel_add)
    monkeypatch.setattr(SmallRowLinear, "add_", add_)
    monkeypatch.setattr(SmallRowLinear, "silu_gated", silu_gated)

    def run(rounds: bool):
        fused[0] = rounds
        engine = PagedEngine(models[1], several_steps())
        engine.model.rounds_rows = rounds and engine.model.rounds_rows
        return tokens_and_logprobs(engine, prompts)

    assert run(True) == run(False)
    # the norm's rounded rows reach q/k/v's linear (gate/up and down take theirs in the fused
    # and the adding kernels, which read them the same way)
    assert set(rounded) == {models[1].model.config.hidden_size}
    assert set(taken) == {"add", "silu"}  # the comparison ran the fused kernels, not fallbacks


def test_rope_and_kv_write_in_one_pass_keep_every_bit(models, prompts, monkeypatch):
    """Each layer rotates q and k and writes the new K/V in one pass (rope_kv_write_): every
    token and log-probability is the same to the bit as with the rotation and the write done
    apart, over prompts of one step and of several."""
    from jobrunner.engine.paged import PagedEngine

    calls, one_pass = [], [True]
    real = cpu_kernels.rope_kv_write_

    def spy(*a):
        calls.append(one_pass[0] and real(*a))  # True: rotated and written in one pass
        return calls[-1]

    monkeypatch.setattr(cpu_kernels, "rope_kv_write_", spy)
    runs = []
    for on in (True, False):
        one_pass[0] = on
        engine = PagedEngine(models[1], several_steps())
        engine.model.native = None  # every step layer by layer, through the spy
        runs.append(tokens_and_logprobs(engine, prompts))
    assert runs[0] == runs[1]
    assert True in calls and False in calls


def test_decode_steps_in_one_native_call_keep_every_bit(models, prompts, amx, monkeypatch):
    """A decode step runs every decoder layer in one native call (NativeLayers): every token
    and log-probability is the same to the bit as layer by layer from Python, over prompts of
    one step and of several; prefill steps keep the Python loop."""
    from jobrunner.engine.paged import PagedEngine

    took = native_calls(monkeypatch)
    runs = []
    for native in (True, False):
        engine = PagedEngine(models[1], several_steps())
        if not native:
            engine.model.native = None
        runs.append(tokens_and_logprobs(engine, prompts))
    assert runs[0] == runs[1]
    assert True in took and False in took


def test_a_module_swapped_between_steps_is_what_the_next_native_step_runs(models, prompts):
    """The native call's table of addresses is built again when a module it came from is
    replaced: after one layer's o_proj is swapped for another Linear (other weights), decode
    steps give what the layer-by-layer loop gives on the swapped model."""
    from torch import nn

    from jobrunner.engine.paged import PagedEngine

    attn = models[1].model.model.layers[2].self_attn
    before = attn.o_proj
    cfg = several_steps()
    cfg.engine.prefix_caching = False  # no K/V the first o_proj made is read after the swap
    engine = PagedEngine(models[1], cfg)
    swapped = nn.Linear(before.in_features, before.out_features, bias=False)
    swapped.weight = nn.Parameter(before.weight.detach().flip(0).clone(), requires_grad=False)

    def swap():
        attn.o_proj = swapped
        return lambda: setattr(attn, "o_proj", before)

    swap_reaches_native_steps(engine, prompts, swap)


def test_a_model_that_keeps_bfloat16_activations_runs_no_float32_accumulating_kernel(
    models, prompts, amx, monkeypatch
):
    """A bfloat16 model with one linear that is not a plain nn.Linear (a quantizer's, or one
    kept in 16-bit) computes in bfloat16 throughout, as HF does: none of its linears, residual
    adds or gated products goes through our bfloat16-weight kernels, which accumulate and add
    in float32."""
    from jobrunner.engine.paged import PagedEngine

    class Kept(torch.nn.Linear):  # what a quantizer leaves in place, or wraps
        pass

    hf = models[1].model
    plain = hf.lm_head
    head = Kept(plain.in_features, plain.out_features, bias=False)
    head.weight = plain.weight
    calls = []
    for name in ("small_gemm_bf16", "small_gemm_bf16_silu", "small_gemm_bf16_add_"):
        real = getattr(cpu_kernels, name)
        monkeypatch.setattr(
            cpu_kernels, name, lambda *a, _n=name, _r=real: calls.append(_n) or _r(*a)
        )
    cfg = JobConfig()
    cfg.engine.kv_cache_bytes = 64 << 20
    hf.lm_head = head  # a module attribute: set and put back by hand (not monkeypatch)
    try:
        engine = PagedEngine(models[1], cfg)
        assert engine.model.act_dtype == torch.bfloat16
        params = SamplingParams(max_new_tokens=4)
        results = list(engine.generate([Request(str(i), p, params) for i, p in enumerate(prompts)]))
    finally:
        hf.lm_head = plain
    assert len(results) == len(prompts) and not any(r.error for r in results)
    assert calls == []


def test_without_the_kernel_a_bfloat16_model_computes_in_bfloat16(models, monkeypatch):
    from jobrunner.engine.paged.model import PagedCausalLM

    monkeypatch.setattr(cpu_kernels, "gemm_bf16_supported", lambda: False)
    model = PagedCausalLM(models[1].model, 256)
    assert model.act_dtype == torch.bfloat16 and model.cos.dtype == torch.bfloat16


def test_biased_projections_take_the_native_decode_call_to_the_bit(models, prompts, monkeypatch):
    """A Qwen2-layout model (q/k/v biases, 2 query heads a KV head, head size 32; random
    bfloat16 weights) runs its decode steps in one native call, biases included, with the same
    tokens and log-probabilities as layer by layer."""
    from dataclasses import replace

    from transformers import Qwen2Config, Qwen2ForCausalLM

    from jobrunner.engine.paged import PagedEngine

    took = native_calls(monkeypatch)
    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=models[1].model.config.vocab_size, hidden_size=128, intermediate_size=256,
        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        max_position_embeddings=512, tie_word_embeddings=True,
    )  # fmt: skip
    qwen = Qwen2ForCausalLM(cfg).to(torch.bfloat16).eval()
    loaded = replace(models[1], model=qwen)
    runs = []
    for native in (True, False):
        engine = PagedEngine(loaded, several_steps())
        assert engine.model.native is not None and engine.model.qkv[0][2] is not None
        if not native:
            engine.model.native = None
        runs.append(tokens_and_logprobs(engine, prompts))
    assert runs[0] == runs[1] and True in took
