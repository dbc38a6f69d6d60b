"""The Triton paged attention kernel (engine/paged/triton_attention.py) against plain attention.

Without CUDA it runs under Triton's interpreter on CPU tensors, so the kernel's indexing, masks
and online softmax are checked on every machine, and it is compiled ahead of time for sm_86, sm_89
and sm_90; with CUDA it runs compiled, on the GPU."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():  # before the kernel module is imported and decorated
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from attention_ref import reference_prefill  # noqa: E402

from jobrunner.engine.paged import triton_attention  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")

# (cached positions before the new tokens, new tokens): decode rows first, then prompt chunks:
# a first token, a block edge, a chunk over several tiles, chunks behind cached context
DECODES = [(0, 1), (15, 1), (16, 1), (70, 1), (130, 1)]
CHUNKS = [(0, 1), (0, 17), (0, 70), (37, 50), (64, 3), (130, 30)]


def cache_like(kind, shape, dtype, g):
    """A cache of `kind` (a torch dtype, or an 8-bit format name) holding random values, and the
    values it holds as the kernel should read them (dequantized), on DEVICE."""
    from jobrunner.engine.quant.kv import KV_FORMATS, QuantizedKV

    values = torch.randn(*shape, generator=g)
    if isinstance(kind, str):
        example = QuantizedKV(KV_FORMATS[kind], (1, 1, 1, 1), dtype, "cpu")
    else:
        example = torch.empty(0, dtype=kind)
    return triton_attention.like(example, values, dtype, DEVICE)


def run_step(work, num_decode, nh, nkv, hd, bs, dtype, cache_kind, seed=0):
    """Attend one step over scattered blocks, the first `num_decode` sequences as decode rows;
    yields ((past, n), got, want) per sequence."""
    g = torch.Generator().manual_seed(seed)
    blocks_needed = [-(-(past + n) // bs) for past, n in work]
    total = sum(blocks_needed) + 5
    k_cache, k_seen = cache_like(cache_kind, (nkv, total, bs, hd), dtype, g)
    v_cache, v_seen = cache_like(cache_kind, (nkv, total, bs, hd), dtype, g)
    free = torch.randperm(total, generator=g).tolist()
    tables, q_start, row = [], [], 0
    for nb, (_, n) in zip(blocks_needed, work, strict=True):
        tables.append([free.pop() for _ in range(nb)])
        q_start.append(row)
        row += n
    q = torch.randn(row, nh, hd, generator=g).to(dtype)
    batch = triton_attention.build_batch(
        tables,
        q_start,
        [n for _, n in work],
        [past + n for past, n in work],
        num_decode,
        triton_attention.prefill_tokens(nh // nkv, dtype, hd),
        DEVICE,
    )
    scale = hd**-0.5
    out = triton_attention.attend(q.to(DEVICE), k_cache, v_cache, batch, scale).cpu()
    k_seen, v_seen = k_seen.float().cpu(), v_seen.float().cpu()
    for (past, n), table, start in zip(work, tables, q_start, strict=True):
        want = reference_prefill(q[start : start + n].float(), k_seen, v_seen, table, past, scale)
        yield (past, n), out[start : start + n], want


@pytest.mark.parametrize("hd,group", [(64, 3), (128, 4), (64, 1), (80, 2)])
@pytest.mark.parametrize("bs", [16, 5])  # 64-key steps that span blocks, or not
def test_mixed_step_matches_causal_attention_over_scattered_blocks(hd, group, bs):
    nkv = 2
    for (past, n), got, want in run_step(
        DECODES + CHUNKS, len(DECODES), nkv * group, nkv, hd, bs, torch.float32, torch.float32
    ):
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5, msg=f"past={past} n={n}")


def test_prompt_chunks_alone_and_decode_rows_alone():
    for work, num_decode in ((CHUNKS, 0), (DECODES, len(DECODES))):
        for (past, n), got, want in run_step(
            work, num_decode, 6, 2, 64, 16, torch.float32, torch.float32
        ):
            torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5, msg=f"{past} {n}")


@pytest.mark.parametrize(
    "dtype,cache_dtype,tol",
    [
        (torch.float32, torch.float16, 2e-5),  # a 16-bit cache under a float32 model
        pytest.param(
            torch.bfloat16,
            torch.bfloat16,
            3e-2,
            marks=pytest.mark.skipif(
                DEVICE.type == "cpu", reason="Triton 3.9's interpreter multiplies bfloat16 wrongly"
            ),
        ),
        (torch.float16, torch.float16, 4e-3),
    ],
)
def test_16_bit_queries_and_caches(dtype, cache_dtype, tol):
    work = DECODES[:3] + CHUNKS[2:4]
    for (past, n), got, want in run_step(work, 3, 6, 2, 64, 16, dtype, cache_dtype, seed=1):
        assert got.dtype == dtype
        torch.testing.assert_close(got.float(), want, atol=tol, rtol=tol, msg=f"{past} {n}")


@pytest.mark.parametrize("fmt", ["int8", "fp8"])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-5), (torch.float16, 4e-3)])
def test_8_bit_caches_are_read_as_codes_times_their_row_scale(fmt, dtype, tol):
    """As the torch path dequantizes them (QuantizedKV.gather)."""
    work = DECODES[:3] + CHUNKS[2:4]
    for (past, n), got, want in run_step(work, 3, 6, 2, 64, 16, dtype, fmt, seed=2):
        torch.testing.assert_close(got.float(), want, atol=tol, rtol=tol, msg=f"{past} {n}")


def test_prefill_tiles_cover_every_new_token_once_most_keys_first():
    per_tile = triton_attention.prefill_tokens(3, torch.bfloat16, 128)  # 3 heads pad to 4
    assert per_tile == 16
    assert triton_attention.prefill_tokens(3, torch.float32, 128) == 8  # wider elements
    assert triton_attention.prefill_tokens(3, torch.float32, 256) == 4  # and wider rows
    b = triton_attention.build_batch(
        [[0], [1, 2], [3, 4, 5]], [0, 1, 21], [1, 20, 33], [9, 20, 40], 1, 16, torch.device("cpu")
    )
    tiles = list(zip(b.tile_seg.tolist(), b.tile_q0.tolist(), strict=True))
    assert sorted(tiles) == [(1, 0), (1, 16), (2, 0), (2, 16), (2, 32)]  # not the decode row
    keys = [40 - 33 + q0 if s == 2 else q0 for s, q0 in tiles]  # cached positions + q0
    assert keys == sorted(keys, reverse=True)
    assert b.tables.tolist() == [[0, 0, 0], [1, 2, 0], [3, 4, 5]]
    decode_only = triton_attention.build_batch([[0]], [0], [1], [9], 1, 16, torch.device("cpu"))
    assert decode_only.tile_seg is None and decode_only.tile_q0 is None


def test_the_caches_and_layouts_it_reads_and_declines():
    from jobrunner.engine.quant.kv import KV_FORMATS, QuantizedKV

    cache = torch.zeros(2, 4, 16, 64, device=DEVICE)
    assert triton_attention.supports(cache, 6, 2, 64)
    assert not triton_attention.supports(cache, 6, 4, 64)  # heads not a multiple of KV heads
    assert not triton_attention.supports(cache[..., :1].expand(2, 4, 16, 300), 6, 2, 300)
    for fmt in ("int8", "fp8"):
        quantized = QuantizedKV(KV_FORMATS[fmt], (2, 4, 16, 64), torch.float32, DEVICE)
        assert triton_attention.supports(quantized, 6, 2, 64)
    assert not triton_attention.supports(cache.to(torch.int32), 6, 2, 64)  # not a cache dtype


# ---------------------------------------------------------------- the engine on this path


@pytest.fixture(scope="module")
def bench_gpu():
    """scripts/bench_gpu.py: its sharpened tiny random Llama and HF greedy reference."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    import bench_gpu

    return bench_gpu


@pytest.mark.parametrize(
    "graphs,drafts,head", [(True, 0, 0), (False, 0, 0), (True, 3, 0), (True, 0, 37)]
)
def test_paged_engine_on_the_triton_path_equals_hf_generate(
    bench_gpu, graphs, drafts, head, monkeypatch
):
    """Rows of different lengths leave one by one, so decode steps shrink through the graph
    buckets (8, 4, 2, 1 rows) with padding rows in most of them. With drafts (speculative
    decoding) a row's draft tokens attend as a prompt tile, and steps with drafts run eagerly.
    With a shared head of 37 tokens (two blocks and part of a third), rows take its blocks
    from rows computing them in the same step and from the prefix cache, and its last tokens
    as copies of a cached block's (ModelRunner.copy_heads on the device)."""
    from jobrunner.config import JobConfig
    from jobrunner.engine.paged import PagedEngine, cuda_graphs
    from jobrunner.types import Request, SamplingParams

    monkeypatch.setenv("JOBRUNNER_TRITON", "1")
    loaded = bench_gpu.sharpened_tiny(DEVICE)
    work = bench_gpu.prompts(6, 20, 140, loaded.model.config.vocab_size, seed=3)
    shared = bench_gpu.prompts(1, head, head, loaded.model.config.vocab_size, seed=4)[0]
    work = [shared + ids for ids in work]
    new = [6 + 3 * i for i in range(len(work))]
    cfg = JobConfig()
    cfg.engine.kv_cache_bytes = 4 << 20
    cfg.engine.cuda_graphs = graphs
    cfg.engine.max_batch_tokens = 128  # prompts prefill in chunks, some behind decode rows
    cfg.engine.speculative_tokens = drafts
    engine = PagedEngine(loaded, cfg)
    assert engine.runner.triton and not engine.runner.decode_kernel
    assert (engine.runner.graphs is not None) == graphs
    replays = []
    if graphs:
        real = cuda_graphs.DecodeGraphs.run
        monkeypatch.setattr(
            cuda_graphs.DecodeGraphs,
            "run",
            lambda self, ids, *a: replays.append(ids.shape[0]) or real(self, ids, *a),
        )
    reqs = [
        Request(str(i), ids, SamplingParams(max_new_tokens=n, ignore_eos=True))
        for i, (ids, n) in enumerate(zip(work, new, strict=True))
    ]
    got = {r.id: r.token_ids for r in engine.generate(reqs)}
    want = [bench_gpu.hf_greedy(loaded, ids, n) for ids, n in zip(work, new, strict=True)]
    bad = [i for i in range(len(work)) if got[str(i)] != want[i]]
    assert not bad, f"rows differing from HF generate: {bad}"
    if head:
        assert engine.stats.cached_tokens >= (len(work) - 1) * 32
        assert engine.block_manager.num_partial_tokens > 0
    if drafts:
        assert engine.stats.accepted_draft_tokens > 0  # the sharpened model repeats itself
    elif graphs:
        assert {1, 3, 5} <= set(replays)  # steps of 3 and 5 rows replay the 4- and 8-row graphs


def test_graph_sizes_pad_a_step_by_less_than_16_rows():
    from jobrunner.engine.paged.cuda_graphs import bucket_sizes

    sizes = bucket_sizes(256)
    assert sizes[:5] == [1, 2, 4, 8, 16] and sizes[-1] == 256
    assert all(b - a <= 16 for a, b in zip(sizes, sizes[1:], strict=False))
    assert bucket_sizes(20) == [1, 2, 4, 8, 16, 20]  # max_num_seqs itself is a size
    assert bucket_sizes(3) == [1, 2, 3]


def test_the_cache_keeps_a_scratch_block_no_sequence_owns():
    from jobrunner.engine.paged.kv_cache import allocate_kv_cache

    kv = allocate_kv_cache(2, 2, 64, 10, 16, torch.float32, torch.device("cpu"))
    assert kv.num_blocks == 10 and kv.scratch_block == 10
    assert all(k.shape[1] == v.shape[1] == 11 for k, v in kv.layers)


def test_the_start_up_check_passes_here_and_a_failing_kernel_or_capture_costs_a_log_line(
    bench_gpu, monkeypatch, caplog
):
    from jobrunner.config import JobConfig
    from jobrunner.engine.paged import PagedEngine, cuda_graphs

    plain = torch.empty(0)  # stands for a float32 cache: the check builds its own like it
    assert triton_attention.self_check(DEVICE, torch.float32, plain, 6, 2, 64) is None
    with monkeypatch.context() as m:  # NaN compares as no error at all unless checked first
        m.setattr(triton_attention, "attend", lambda q, *a: torch.full_like(q, float("nan")))
        assert triton_attention.self_check(DEVICE, torch.float32, plain, 6, 2, 64) == (
            "non-finite output"
        )
    monkeypatch.setenv("JOBRUNNER_TRITON", "1")
    loaded = bench_gpu.sharpened_tiny(DEVICE)
    cfg = JobConfig()
    cfg.engine.kv_cache_bytes = 1 << 20
    with monkeypatch.context() as m:
        m.setattr(triton_attention, "self_check", lambda *a: "largest error 1e+00")
        engine = PagedEngine(loaded, cfg)
    assert not engine.runner.triton and engine.runner.graphs is None
    assert "failed its start-up check (largest error 1e+00)" in caplog.text

    def no_capture(self, graph_type=None):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(cuda_graphs.DecodeGraphs, "capture", no_capture)
    engine = PagedEngine(loaded, cfg)
    assert engine.runner.triton and engine.runner.graphs is None
    assert "decode runs eagerly" in caplog.text


# the shared memory one block may use: sm_86 and sm_89 (the least; sm_80 has 163 KiB), sm_90
SHARED_LIMIT = {86: 99 << 10, 89: 99 << 10, 90: 227 << 10}
# (dtype, decode, query heads per KV head, head_dim, CODES): Llama-3-8B's and SmolLM2's layouts,
# MHA, wide heads, and 8-bit caches (compiled for sm_86 and sm_90; fp8 codes, which convert on
# sm_89 or later only, for sm_89 and sm_90)
LAUNCHES = [
    (torch.bfloat16, True, 4, 128, 0),
    (torch.bfloat16, False, 4, 128, 0),
    (torch.float32, True, 4, 128, 0),
    (torch.float32, False, 4, 128, 0),
    (torch.float16, False, 3, 64, 0),
    (torch.float32, False, 1, 80, 0),
    (torch.bfloat16, False, 8, 256, 0),
    (torch.float32, False, 2, 256, 0),
    (torch.bfloat16, True, 4, 128, 1),
    (torch.bfloat16, False, 4, 128, 1),
    (torch.float32, False, 4, 128, 1),
    (torch.bfloat16, False, 4, 128, 2),
]


COMPILE = """
import json, sys, torch, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from jobrunner.engine.paged import triton_attention, triton_kernel

fn = triton_kernel.paged_attention_kernel
for dtype, decode, group, hd, codes, arch in json.loads(sys.argv[1]):
    dtype = getattr(torch, dtype)
    elem = {torch.float32: "*fp32", torch.bfloat16: "*bf16", torch.float16: "*fp16"}[dtype]
    tokens = triton_attention.prefill_tokens(group, dtype, hd)
    consts = triton_attention.constants(dtype, group, hd, decode, tokens, codes)
    cache = "*u8" if codes else elem
    pointers = dict(Q=elem, Out=elem, K=cache, V=cache, K_scale="*fp16", V_scale="*fp16")
    signature = {}
    for n in fn.arg_names:
        if n in consts:
            signature[n] = "constexpr"
        elif n in pointers:
            signature[n] = pointers[n]
        elif n.startswith(("tables", "seg_", "tile_")):
            signature[n] = "*i32"
        else:
            signature[n] = "fp32" if n == "scale" else "i32"
    # as a real launch specialises them: aligned pointers, strides and block size divisible by 16
    # (loads vectorise and stage through shared memory asynchronously, which needs more of it).
    # Not the scale, a table's width (any number of blocks) or the per-row scales' strides.
    loose = ("scale", "stride_tab", "stride_sh", "stride_sb", "stride_ss")
    aligned = {
        (i,): [["tt.divisibility", 16]]
        for i, n in enumerate(fn.arg_names)
        if signature[n] != "constexpr" and n not in loose
    }
    src = ASTSource(fn=fn, signature=signature, constexprs=consts, attrs=aligned)
    out = triton.compile(src, target=GPUTarget("cuda", arch, 32), options={"num_warps": 4})
    print(json.dumps({"shared": out.metadata.shared, "cubin": len(out.asm["cubin"])}))
"""


def test_the_kernel_compiles_for_gpus_within_their_shared_memory():
    """Ahead of time, with the ptxas Triton ships (no GPU needed): a kernel only the interpreter
    ever ran could still fail to compile for a real GPU. Exactly the launches' compile-time
    parameters; in a subprocess, as the interpreter patches Triton's language in this one."""
    import json
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    work = [
        [str(dtype).removeprefix("torch."), decode, group, hd, codes, arch]
        for dtype, decode, group, hd, codes in LAUNCHES
        for arch in ((89, 90) if codes == 2 else (86, 90))
    ]
    run = subprocess.run(
        [sys.executable, "-c", COMPILE, json.dumps(work)], env=env, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr[-3000:]
    results = [json.loads(line) for line in run.stdout.strip().splitlines()]
    assert len(results) == len(work)
    for w, got in zip(work, results, strict=True):
        assert got["cubin"] > 0 and got["shared"] <= SHARED_LIMIT[w[-1]], (w, got)


@pytest.mark.parametrize("kv", ["int8", "fp8"])
def test_an_8_bit_cache_gives_the_same_tokens_on_every_attention_path(bench_gpu, kv, monkeypatch):
    """Every path reads the same codes times the same scales, a prompt chunk's own keys too (the
    torch path once attended those unquantized: its first tokens differed); only the order of
    the sums differs, and the tiny model's logits are sharpened, so that cannot move a token.
    Paths: the Triton kernel, the device's own (CPU kernels, or the torch path on CUDA), and
    the torch path."""
    from jobrunner.config import JobConfig
    from jobrunner.engine.paged import PagedEngine, cpu_kernels
    from jobrunner.types import Request, SamplingParams

    loaded = bench_gpu.sharpened_tiny(DEVICE)
    work = bench_gpu.prompts(16, 20, 100, loaded.model.config.vocab_size, seed=4)
    cfg = JobConfig()
    cfg.engine.kv_cache_bytes = 4 << 20
    cfg.model.kv_cache_dtype = kv
    reqs = [
        Request(str(i), ids, SamplingParams(max_new_tokens=12, ignore_eos=True))
        for i, ids in enumerate(work)
    ]
    tokens = {}
    try:
        for path, triton, native in [("triton", "1", "1"), ("own", "0", "1"), ("torch", "0", "0")]:
            monkeypatch.setenv("JOBRUNNER_TRITON", triton)
            monkeypatch.setenv("JOBRUNNER_CPU_KERNELS", native)
            cpu_kernels.load.cache_clear()
            engine = PagedEngine(loaded, cfg)
            assert engine.runner.triton == (triton == "1")
            if native == "0":
                assert not engine.runner.decode_kernel
            tokens[path] = {r.id: r.token_ids for r in engine.generate(reqs)}
    finally:  # later tests load the kernels as the environment says
        monkeypatch.delenv("JOBRUNNER_CPU_KERNELS", raising=False)
        cpu_kernels.load.cache_clear()
    assert tokens["own"] == tokens["triton"]
    assert tokens["torch"] == tokens["triton"]
    assert all(len(t) == 12 for t in tokens["triton"].values())
