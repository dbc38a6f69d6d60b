"""A float32 model's decode steps in one native call (native_layers.NativeLayers over
csrc/decode_layers.c with float32 weights): the same tokens and log-probabilities, to the bit, as
the layer-by-layer loop, on CPUs where our float32 linears build (AVX-512, AVX2, NEON). The
mixed mode's (bfloat16 weights) tests are in test_bf16_cpu.py."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from stepkit import native_calls, several_steps, swap_reaches_native_steps, tokens_and_logprobs

from jobrunner.engine.paged import cpu_kernels

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not cpu_kernels.gemm_supported(), reason="no float32 vector kernel here"),
]

QUESTIONS = [
    "What is the capital of France?",
    "Explain recursion to a child, with an example.",
    "Why is the sky blue?",
    "What is the difference between a list and a tuple in Python? Explain with care.",
]


@pytest.fixture(scope="module")
def prompts(tokenizer) -> list[list[int]]:
    out = []
    for q in QUESTIONS:
        msgs = [{"role": "user", "content": q}]
        ids = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
        out.append(list(ids if isinstance(ids, list) else ids["input_ids"]))
    return out


@pytest.fixture(autouse=True)
def two_threads():
    """2 threads, as the kernels split their work on this machine; the count restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def calls(monkeypatch) -> list[bool]:
    return native_calls(monkeypatch)


def _both_ways(loaded, prompts, cfg=None) -> list[dict]:
    from jobrunner.engine.paged import PagedEngine

    runs = []
    for native in (True, False):
        engine = PagedEngine(loaded, cfg or several_steps())
        assert engine.model.native is not None
        if not native:
            engine.model.native = None
        runs.append(tokens_and_logprobs(engine, prompts))
    return runs


def test_float32_decode_steps_in_one_native_call_keep_every_bit(model_f32, prompts, calls):
    """SmolLM2 in float32 (the oracle's dtype): each decode step's layers in one call give
    every token and log-probability the layer loop gives; prefill steps keep the loop."""
    runs = _both_ways(model_f32, prompts)
    assert runs[0] == runs[1]
    assert True in calls and False in calls


def test_float32_steps_of_many_rows_keep_every_bit(model_f32, prompts, calls):
    """Decode steps of 20 rows: the rotation and the K/V write split among the threads (from
    16 rows) and the queries read in place by both threads give the loop's bits."""
    cfg = several_steps()
    cfg.engine.max_batch_tokens = 4096  # every prompt in the first step: then 20 rows a step
    runs = _both_ways(model_f32, prompts * 5, cfg)
    assert runs[0] == runs[1] and True in calls


@pytest.mark.parametrize("head_dim", [32, 40])  # 40: no specialised attention kernel for it
def test_float32_biased_projections_and_any_mlp_width_take_the_native_call(
    model_f32, prompts, calls, head_dim
):
    """A Qwen2 layout in float32 (q/k/v biases, 2 query heads a KV head, an MLP of 200: no
    multiple of 32, which only the bfloat16 kernel needs) runs its decode steps in one call
    with the loop's bits."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=model_f32.model.config.vocab_size, hidden_size=128, intermediate_size=200,
        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=head_dim,
        max_position_embeddings=512, tie_word_embeddings=True,
    )  # fmt: skip
    qwen = Qwen2ForCausalLM(cfg).float().eval()
    runs = _both_ways(replace(model_f32, model=qwen), prompts)
    assert runs[0] == runs[1] and True in calls


@pytest.mark.parametrize("how", ["parameter", "storage"])
def test_a_norm_weight_replaced_between_steps_is_what_the_next_native_step_reads(
    model_f32, prompts, calls, how
):
    """A float32 model's norm weights are read in place: when one is replaced, by another
    Parameter or by new storage under the same one (`p.data = t`), the next decode steps,
    still in the native call, read the new weights, as the layer loop does."""
    from torch import nn

    from jobrunner.engine.paged import PagedEngine

    layers = model_f32.model.model.layers
    norms = [layers[1].input_layernorm, layers[3].post_attention_layernorm]
    cfg = several_steps()
    cfg.engine.prefix_caching = False
    engine = PagedEngine(model_f32, cfg)
    before = [x.weight for x in norms]
    data = [x.weight.data for x in norms]

    def swap():
        for norm, w in zip(norms, before, strict=True):
            flipped = w.detach().flip(0).clone()
            if how == "parameter":
                norm.weight = nn.Parameter(flipped, requires_grad=False)
            else:
                norm.weight.data = flipped

        def undo():
            for norm, w, d in zip(norms, before, data, strict=True):
                norm.weight = w
                norm.weight.data = d

        calls.clear()
        return undo

    swap_reaches_native_steps(engine, prompts, swap)
    assert True in calls  # after the swap, decode steps still ran in the native call
