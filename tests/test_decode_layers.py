"""A float32 model's decode steps in one native call (native_layers.NativeLayers over
csrc/decode_layers.c with float32 weights): the same tokens and log-probabilities, to the bit, as
the layer-by-layer loop, on CPUs where our float32 linears build (AVX-512, AVX2, NEON). The
mixed mode's (bfloat16 weights) tests are in test_bf16_cpu.py."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from stepkit import several_steps, swap_reaches_native_steps, tokens_and_logprobs

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


@pytest.fixture
def calls(monkeypatch) -> list[bool]:
    """What each NativeLayers.run returned: True where a step ran in the native call."""
    from jobrunner.engine.paged.native_layers import NativeLayers

    took, real = [], NativeLayers.run
    monkeypatch.setattr(NativeLayers, "run", lambda *a: took.append(real(*a)) or took[-1])
    return took


def _both_ways(loaded, prompts) -> list[dict]:
    from jobrunner.engine.paged import PagedEngine

    torch.set_num_threads(2)
    runs = []
    for native in (True, False):
        engine = PagedEngine(loaded, several_steps())
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


def test_float32_biased_projections_and_any_mlp_width_take_the_native_call(
    model_f32, prompts, calls
):
    """A Qwen2 layout in float32 (q/k/v biases, 2 query heads a KV head, head size 32, an MLP
    of 200: no multiple of 32, which only the bfloat16 kernel needs) runs its decode steps in
    one call with the loop's bits."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=model_f32.model.config.vocab_size, hidden_size=128, intermediate_size=200,
        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        max_position_embeddings=512, tie_word_embeddings=True,
    )  # fmt: skip
    qwen = Qwen2ForCausalLM(cfg).float().eval()
    runs = _both_ways(replace(model_f32, model=qwen), prompts)
    assert runs[0] == runs[1] and True in calls


def test_a_norm_weight_swapped_between_steps_is_what_the_next_native_step_reads(model_f32, prompts):
    """A float32 model's norm weights are read in place: when one is replaced by another
    Parameter, the next decode steps read the new one (the table is built again), as the layer
    loop does."""
    from torch import nn

    from jobrunner.engine.paged import PagedEngine

    norm = model_f32.model.model.layers[3].post_attention_layernorm
    before = norm.weight
    cfg = several_steps()
    cfg.engine.prefix_caching = False
    torch.set_num_threads(2)
    engine = PagedEngine(model_f32, cfg)

    def swap():
        norm.weight = nn.Parameter(before.detach().flip(0).clone(), requires_grad=False)
        return lambda: setattr(norm, "weight", before)

    swap_reaches_native_steps(engine, prompts, swap)
