"""Quantization: int8 / int4 / fp8 weights, int8 / fp8 KV cache, quantize-check, the quality gate.

Model tests run the real SmolLM2-135M in bfloat16 (the 16-bit baseline the memory bounds are
stated against). Agreement bounds were set from measured figures with a margin (see
scripts/bench_quant.py): on 8 questions x 16 tokens, teacher-forced agreement was 95% (int8)
and 72% (int4); the unquantized model itself scores 98% (engine vs full-forward numerics).
"""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch
from typer.testing import CliRunner

from jobrunner.config import JobConfig, ModelConfig, load_job
from jobrunner.engine.quant import QUANTIZERS, apply_quantization, get_quantizer, weight_bytes
from jobrunner.engine.quant.base import quantize_model
from jobrunner.engine.quant.int4 import Int4Quantizer, quantize_groups
from jobrunner.engine.quant.int8 import Int8Quantizer
from jobrunner.engine.quant.kv import KV_FORMATS, QuantizedKV, kv_bytes_per_token
from jobrunner.engine.quant.quality import exact_prefix, nll_and_top1
from jobrunner.errors import ConfigError
from jobrunner.quant_check import LayerError, propose
from jobrunner.types import Request, SamplingParams

NEW = 12
QUESTIONS = [
    "What is the capital of France?",
    "Why is the sky blue?",
    "Explain recursion to a child.",
    "What does HTTP status 404 mean?",
]
KV_BUDGET = 16 << 20


# ---------------------------------------------------------------- units (no model)


def test_registry_has_the_four_formats():
    assert sorted(QUANTIZERS) == ["fp8", "int4", "int8", "none"]
    with pytest.raises(ConfigError, match="'int3' is not one of"):
        get_quantizer("int3")


def test_fp8_weights_refused_on_cpu_with_a_clear_error():
    with pytest.raises(ConfigError, match="fp8 needs a CUDA GPU"):
        get_quantizer("fp8").check(torch.device("cpu"), torch.bfloat16)


def test_int4_refused_on_cuda():
    with pytest.raises(ConfigError, match="int4 runs on CPU only"):
        Int4Quantizer().check(torch.device("cuda"), torch.bfloat16)


@pytest.mark.parametrize("rows", [1, 5, 40, 80])  # float32: the kernel in bf16 to 64, dequant above
def test_int8_linear_is_the_dequantized_matmul(rows):
    g = torch.Generator().manual_seed(0)
    w, x = torch.randn(96, 128, generator=g), torch.randn(rows, 128, generator=g)
    q = Int8Quantizer()
    state = q.quantize_weight(w)
    deq = state["qweight"].float() * state["scale"][:, None]
    assert (deq - w).abs().max() <= state["scale"].max() / 2 + 1e-6  # half a step at most
    y = q.linear(state, None)(x.view(1, rows, 128))  # leading dims are kept
    assert y.shape == (1, rows, 96) and y.dtype == torch.float32
    if rows <= 64:  # rows rounded to bfloat16 into the int8 kernel, its output bfloat16 too
        want = x.to(torch.bfloat16).float() @ deq.T
        torch.testing.assert_close(y[0], want, rtol=1e-2, atol=5e-2)
    else:
        torch.testing.assert_close(y[0], x @ deq.T, rtol=1e-4, atol=1e-4)
    bf = q.linear(q.quantize_weight(w.to(torch.bfloat16)), None)(x.to(torch.bfloat16))
    torch.testing.assert_close(bf.float(), x @ deq.T, rtol=3e-2, atol=5e-1)  # a bf16 model


def test_int4_linear_and_embedding_match_the_dequantized_weight():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(64, 128, generator=g)
    q = Int4Quantizer(group_size=32)
    codes, scale, zero = quantize_groups(w, 32)
    deq = ((codes.view(64, 4, 32) - 8) * scale[..., None] + zero[..., None]).view(64, 128)
    assert (deq - w).abs().max() <= scale.max() / 2 + 1e-5
    x = torch.randn(3, 128, generator=g)
    y = q.linear(q.quantize_weight(w), None)(x)  # float32 rows go in as bfloat16
    assert y.dtype == torch.float32
    torch.testing.assert_close(y, x.to(torch.bfloat16).float() @ deq.T, rtol=1e-2, atol=5e-2)
    ids = torch.tensor([[0, 63, 5]])
    torch.testing.assert_close(q.embedding(w, None)(ids), deq[ids], rtol=1e-5, atol=1e-5)
    assert q.supports(torch.zeros(8, 100)) == "100 input channels, not a multiple of 32"


@pytest.mark.parametrize("fmt", ["int8", "fp8"])
def test_quantized_kv_round_trip(fmt):
    g = torch.Generator().manual_seed(0)
    kv = QuantizedKV(KV_FORMATS[fmt], (2, 4, 4, 16), torch.float32, "cpu")  # nkv, blocks, bs, hd
    x = torch.randn(3, 2, 16, generator=g)  # (T, nkv, hd)
    kv.write(torch.tensor([5, 6, 13]), x)  # block 1 slots 1, 2; block 3 slot 1
    got = kv.gather(torch.tensor([1, 3]))  # (nkv, 8, hd)
    back = torch.stack([got[:, 1], got[:, 2], got[:, 5]])  # (T, nkv, hd)
    rel = (back - x).abs().max() / x.abs().max()
    assert rel < (0.005 if fmt == "int8" else 0.07)
    assert got[:, 0].abs().sum() == 0  # untouched slots dequantize to zeros


def test_kv_bytes_per_token_for_smollm2_shape():
    from jobrunner.engine.paged.kv_cache import kv_bytes_per_token as paged_bytes

    assert paged_bytes(30, 3, 64, torch.bfloat16) == 23040
    assert paged_bytes(30, 3, 64, torch.bfloat16, "int8") == 11880  # 64 codes + a 2-byte scale
    assert kv_bytes_per_token(30, 3, 64, "fp8") == 11880


def test_a_minimum_agreement_without_a_quality_check_is_a_config_error(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text("model:\n  quantization: int8\n  quality_min_agreement: 0.9\n")
    with pytest.raises(
        ConfigError, match=r"job.yaml:1 model: quality_min_agreement needs quality_check"
    ):
        load_job(job)


def test_propose_keeps_lm_head_and_the_worst_five_percent():
    errs = [LayerError(f"model.layers.{i}.mlp.down_proj", 8, 8, 1.0 - i / 100) for i in range(40)]
    errs.insert(3, LayerError("lm_head", 8, 8, 0.01))
    assert propose(errs) == [
        "lm_head",
        "model.layers.0.mlp.down_proj",
        "model.layers.1.mlp.down_proj",
    ]


def test_exact_prefix_counts_missing_tokens_as_different():
    assert exact_prefix([[1, 2, 3, 4]], [[1, 2, 9, 4]], 4) == 0.75
    assert exact_prefix([[1, 2, 3, 4], [5]], [[1, 2], [5]], 4) == 3 / 5


# ---------------------------------------------------------------- the real model


@pytest.fixture(scope="module")
def base():
    from jobrunner.engine.loader import load_model

    torch.set_num_threads(1)  # 2 threads on a shared 2-core host stall in OpenMP barriers
    return load_model(ModelConfig(dtype="bfloat16"))


def fresh(base):
    """A deep copy of the loaded model (quantization swaps modules in place)."""
    loaded = copy.copy(base)
    loaded.model = copy.deepcopy(base.model)
    return loaded


@pytest.fixture(scope="module")
def reqs(base) -> list[Request]:
    out = []
    for i, q in enumerate(QUESTIONS):
        ids = base.tokenizer.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True
        )
        ids = list(ids if isinstance(ids, list) else ids["input_ids"])
        out.append(Request(f"q{i}", ids, SamplingParams(max_new_tokens=NEW, ignore_eos=True)))
    return out


def generate(loaded, reqs, quant="none", kv="auto", kind="paged"):
    from jobrunner.engine.engines import make_engine

    cfg = JobConfig()
    cfg.model.quantization, cfg.model.kv_cache_dtype = quant, kv
    cfg.engine.kind, cfg.engine.kv_cache_bytes = kind, KV_BUDGET
    apply_quantization(loaded, cfg.model)
    engine = make_engine(loaded, cfg)
    out = {r.id: list(r.token_ids) for r in engine.generate(iter(reqs))}
    return [out[r.id] for r in reqs], engine


@pytest.fixture(scope="module")
def reference(base, reqs):
    tokens, engine = generate(base, reqs)
    return tokens, engine.stats.num_kv_blocks


def agreement(loaded, reqs, ref_tokens) -> float:
    _, top1 = nll_and_top1(loaded.model, [r.prompt_token_ids for r in reqs], ref_tokens)
    return float((top1 == torch.tensor([t for x in ref_tokens for t in x])).float().mean())


@pytest.mark.slow
@pytest.mark.parametrize(
    ("mode", "max_memory", "min_agreement"), [("int8", 0.55, 0.85), ("int4", 0.35, 0.55)]
)
def test_weights_shrink_and_greedy_outputs_stay_close(
    base, reqs, reference, mode, max_memory, min_agreement
):
    loaded = fresh(base)
    tokens, engine = generate(loaded, reqs, mode)
    assert weight_bytes(loaded.model) <= max_memory * weight_bytes(base.model)
    assert engine.kind == "paged" and all(len(t) == NEW for t in tokens)
    assert agreement(loaded, reqs, reference[0]) >= min_agreement
    first = sum(a[0] == b[0] for a, b in zip(tokens, reference[0], strict=True))
    assert first >= len(reqs) - 1  # the first token (argmax after the prompt) rarely moves


@pytest.mark.slow
@pytest.mark.parametrize("kv", ["int8", "fp8"])
def test_kv_quantization_raises_block_count_and_keeps_outputs_close(base, reqs, reference, kv):
    tokens, engine = generate(base, reqs, "none", kv)
    ref_tokens, ref_blocks = reference
    assert engine.stats.kv_bytes_per_token == 11880
    assert engine.stats.num_kv_blocks >= 1.9 * ref_blocks
    # prefill attention reads its own new rows from the 8-bit cache too, so the first token may
    # move, as it may under quantized weights
    first = sum(a[0] == b[0] for a, b in zip(tokens, ref_tokens, strict=True))
    assert first >= len(reqs) - 1
    assert exact_prefix(ref_tokens, tokens, NEW) >= 0.5


@pytest.mark.slow
def test_keep_in_16bit_keeps_the_named_layers(base):
    loaded = fresh(base)
    summary = quantize_model(loaded.model, get_quantizer("int8"), ["lm_head", "*.0.mlp.down_proj"])
    assert isinstance(loaded.model.lm_head, torch.nn.Linear)
    assert isinstance(loaded.model.model.layers[0].mlp.down_proj, torch.nn.Linear)
    assert not isinstance(loaded.model.model.layers[1].mlp.down_proj, torch.nn.Linear)
    # the tied embedding shares lm_head's 16-bit weight, so it stays too
    assert summary.kept_16bit == ["model.layers.0.mlp.down_proj", "lm_head", "model.embed_tokens"]
    with pytest.raises(ConfigError, match="'lm_haed' matches no layer"):
        quantize_model(fresh(base).model, get_quantizer("int8"), ["lm_haed"])


@pytest.mark.slow
def test_static_engine_runs_quantized_weights_and_refuses_a_quantized_kv_cache(base, reqs):
    from jobrunner.engine.quant.apply import prepare_weights

    ref, _ = generate(base, reqs[:1], kind="static")
    tokens, engine = generate(fresh(base), reqs[:1], "int8", kind="static")
    assert engine.kind == "static"
    assert exact_prefix(ref, tokens, NEW) >= 0.5
    cfg = JobConfig()
    cfg.model.kv_cache_dtype, cfg.engine.kind = "int8", "static"
    with pytest.raises(ConfigError, match="needs the paged engine"):
        prepare_weights(base, cfg)


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9),
    reason="fp8 needs a CUDA GPU with compute capability 8.9+",
)
def test_fp8_weights_on_gpu(reqs):
    from jobrunner.engine.loader import load_model

    gpu = load_model(ModelConfig(dtype="bfloat16", device="cuda"))
    ref, _ = generate(gpu, reqs)
    before = weight_bytes(gpu.model)
    tokens, _ = generate(gpu, reqs, "fp8")
    assert weight_bytes(gpu.model) <= 0.55 * before
    assert agreement(gpu, reqs, ref) >= 0.85


# ---------------------------------------------------------------- the job level


def write_input(tmp_path, n: int = 3):
    with open(tmp_path / "in.jsonl", "w") as f:
        for i, q in enumerate(QUESTIONS[:n]):
            f.write(json.dumps({"id": f"r{i}", "prompt": q}) + "\n")


JOB = """name: qgate
model: {{source: smollm2-135m-instruct, dtype: bfloat16, quantization: {quant}, quality_check: 3}}
input: {{path: {dir}/in.jsonl, prompt: {{column: prompt}}}}
generation: {{max_new_tokens: {new}}}
output: {{path: {dir}/out, format: jsonl}}
engine: {{kv_cache_bytes: {kv}, num_threads: 1}}
"""


@pytest.mark.slow
def test_quality_gate_fails_the_job_above_what_the_model_achieves(base, tmp_path):
    from jobrunner.cli import app
    from jobrunner.engine.quant.apply import prepare_weights

    write_input(tmp_path)
    job = tmp_path / "job.yaml"
    job.write_text(JOB.format(quant="int4", dir=tmp_path, new=NEW, kv=KV_BUDGET))
    measured = prepare_weights(fresh(base), load_job(job))["quality"]
    assert measured["rows"] == 3 and 3 <= measured["tokens"] <= 3 * NEW  # EOS may end a row early
    assert 0.0 < measured["agreement"] < 1.0 and measured["ppl_change"] > 0.0
    above = math.floor(measured["agreement"] * 1000 + 1) / 1000
    res = CliRunner().invoke(
        app, ["run", str(job), "--set", f"model.quality_min_agreement={above}"]
    )
    assert res.exit_code == 65, res.output
    assert "model.quality_min_agreement" in res.output
    assert not (tmp_path / "out" / "_SUCCESS").exists()
    assert not list((tmp_path / "out" / "results").glob("part-*"))


@pytest.mark.slow
def test_a_kv_only_format_gets_its_quality_measured(base, tmp_path):
    """Weights untouched: agreement is the unquantized model's own (the noise floor between the
    engine and a full forward pass, the 8-bit cache included); exact_prefix is what the cache
    costs in generated tokens."""
    from jobrunner.engine.quant.apply import prepare_weights

    write_input(tmp_path)
    job = tmp_path / "job.yaml"
    job.write_text(JOB.format(quant="none", dir=tmp_path, new=NEW, kv=KV_BUDGET))
    cfg = load_job(job)
    cfg.model.kv_cache_dtype = "int8"
    measured = prepare_weights(fresh(base), cfg)["quality"]
    assert measured["rows"] == 3
    assert measured["agreement"] == measured["agreement_unquantized"] >= 0.9
    assert 0.0 < measured["exact_prefix"] <= 1.0


@pytest.mark.slow
def test_quantize_check_writes_a_plan_the_job_accepts(tmp_path):
    from jobrunner.cli import app

    write_input(tmp_path, 2)
    job = tmp_path / "job.yaml"
    job.write_text(JOB.format(quant="none", dir=tmp_path, new=4, kv=KV_BUDGET))
    res = CliRunner().invoke(
        app,
        [
            "quantize-check",
            str(job),
            "--sample",
            "2",
            "--quantization",
            "int4",
            "--write",
            str(tmp_path / "planned.yaml"),
        ],
    )
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert summary["layers"] == 211 and summary["sampled_rows"] == 2
    cfg = load_job(tmp_path / "planned.yaml")
    assert cfg.model.quantization == "int4"
    assert cfg.model.keep_in_16bit == summary["keep_in_16bit"]
    assert cfg.model.keep_in_16bit[0] == "lm_head" and len(cfg.model.keep_in_16bit) == 1 + 11
