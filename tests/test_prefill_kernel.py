"""The native prefill attention kernel (csrc/paged_prefill.c) against plain causal attention."""

from __future__ import annotations

import pytest
import torch
from attention_ref import reference_prefill

from jobrunner.engine.paged import cpu_kernels

pytestmark = pytest.mark.skipif(
    not cpu_kernels.prefill_supported(9, 3, 64),
    reason="no vector prefill kernel (AVX-512 or AVX2) on this CPU",
)

# (cached positions before the chunk, chunk length): one token, tile edges (16 query tokens
# with AVX-512, 8 with AVX2),
# key spans of 64 and their tails, chunks behind cached context, one token behind a long one
CHUNKS = [
    (0, 1),
    (0, 8),
    (5, 9),
    (0, 15),
    (0, 16),
    (0, 17),
    (0, 130),
    (37, 50),
    (64, 64),
    (200, 1),
    (130, 300),
]


def caches(nkv, num_blocks, bs, hd, dtype, g):
    k = torch.randn(nkv, num_blocks, bs, hd, generator=g).to(dtype)
    return k, torch.randn(nkv, num_blocks, bs, hd, generator=g).to(dtype)


@pytest.mark.parametrize("hd,group", [(64, 3), (128, 8), (64, 1), (128, 4)])
@pytest.mark.parametrize("bs", [16, 5])  # 16-key chunks that span blocks, or not
def test_paged_prefill_matches_causal_attention_over_scattered_blocks(hd, group, bs):
    g = torch.Generator().manual_seed(0)
    nkv = 2
    for start, n in CHUNKS:
        nb = -(-(start + n) // bs)
        k_cache, v_cache = caches(nkv, nb + 7, bs, hd, torch.float32, g)
        block_ids = torch.randperm(nb + 7, generator=g)[:nb]
        q = torch.randn(n, nkv * group, hd, generator=g)
        got = cpu_kernels.paged_prefill(q, k_cache, v_cache, block_ids, start, hd**-0.5)
        want = reference_prefill(q, k_cache, v_cache, block_ids, start, hd**-0.5)
        assert got.shape == q.shape
        torch.testing.assert_close(got, want, atol=3e-6, rtol=3e-6, msg=f"start={start} n={n}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])  # bfloat16: the AMX path
def test_paged_prefill_reads_queries_in_place_and_writes_into_the_output_given(dtype):
    """Queries sliced from a fused q/k/v projection (row stride past the q heads) give the
    bits of the same queries made contiguous, written into the `out` rows handed in, and the
    rows around them untouched."""
    g = torch.Generator().manual_seed(5)
    nh, nkv, hd, bs = 9, 3, 64, 16
    for start, n in [(0, 130), (37, 50), (200, 1)]:
        nb = -(-(start + n) // bs)
        k_cache, v_cache = caches(nkv, nb + 3, bs, hd, dtype, g)
        block_ids = torch.randperm(nb + 3, generator=g)[:nb]
        qkv = torch.randn(n, nh + 2 * nkv, hd, generator=g)
        q = qkv[:, :nh]
        want = cpu_kernels.paged_prefill(q.contiguous(), k_cache, v_cache, block_ids, start, 0.125)
        out = torch.full((n + 2, nh, hd), 7.0)
        got = cpu_kernels.paged_prefill(q, k_cache, v_cache, block_ids, start, 0.125, out[1:-1])
        assert got.data_ptr() == out[1].data_ptr()
        assert torch.equal(out[1:-1], want), f"start={start} n={n}"
        assert bool((out[0] == 7).all()) and bool((out[-1] == 7).all())


@pytest.mark.parametrize("dtype,tol", [(torch.bfloat16, 2e-2), (torch.float16, 4e-3)])
def test_paged_prefill_keeps_16_bit_queries_and_reads_a_16_bit_cache(dtype, tol):
    g = torch.Generator().manual_seed(1)
    start, n, bs = 40, 70, 16
    nb = -(-(start + n) // bs)
    k_cache, v_cache = caches(3, nb, bs, 64, dtype, g)
    block_ids = torch.randperm(nb, generator=g)
    q = torch.randn(n, 9, 64, generator=g).to(dtype)
    got = cpu_kernels.paged_prefill(q, k_cache, v_cache, block_ids, start, 0.125)
    assert got.dtype == dtype
    want = reference_prefill(q, k_cache, v_cache, block_ids, start, 0.125)
    torch.testing.assert_close(got.float(), want, atol=tol, rtol=tol)


@pytest.mark.parametrize("hd,group", [(64, 3), (128, 8), (64, 1), (128, 4)])
@pytest.mark.parametrize("bs", [16, 5])
def test_a_bfloat16_cache_with_float32_queries_is_bfloat16_attention(hd, group, bs, amx):
    """The mixed mode's prefill (float32 queries over a bfloat16 cache): on AVX-512 BF16 the
    queries and softmax weights are rounded to bfloat16 for vdpbf16ps or, with AMX on, for the
    tiles; scores, sums and outputs stay float32. Against float64 attention on the
    bfloat16-rounded queries, every output is within the weights' rounding (2^-9 of a value of
    about 1). Elsewhere the float32 path runs on the queries as they are, within float32
    rounding of attention on them."""
    g = torch.Generator().manual_seed(3)
    nkv = 2
    bf16_dot = cpu_kernels.gemm_bf16_supported()  # AVX-512 BF16: the kernel's bf16 tiles
    tol = 8e-3 if bf16_dot else 3e-5
    for start, n in CHUNKS + [(0, 700)]:
        nb = -(-(start + n) // bs)
        k_cache, v_cache = caches(nkv, nb + 7, bs, hd, torch.bfloat16, g)
        block_ids = torch.randperm(nb + 7, generator=g)[:nb]
        q = torch.randn(n, nkv * group, hd, generator=g)
        got = cpu_kernels.paged_prefill(q, k_cache, v_cache, block_ids, start, hd**-0.5)
        assert got.dtype == torch.float32
        used = q.to(torch.bfloat16).float() if bf16_dot else q
        want = reference_prefill(used, k_cache, v_cache, block_ids, start, hd**-0.5)
        torch.testing.assert_close(got, want, atol=tol, rtol=0, msg=f"start={start} n={n}")


def test_peaked_scores_move_the_running_max_across_spans(amx):
    """Scores tens of units apart whose largest keys come late (each span's keys larger than
    the last): the running max moves span after span, the outputs already summed are
    rescaled each time, and every output still equals float64 attention within the weights'
    rounding (AMX keeps a lane's max until the scores pass it by 2^8)."""
    g = torch.Generator().manual_seed(4)
    nkv, group, hd, bs, start, n = 2, 3, 64, 16, 300, 40
    nb = -(-(start + n) // bs)
    k = torch.randn(nkv, nb, bs, hd, generator=g)
    k = k * torch.linspace(0.2, 6.0, nb * bs).view(1, nb, bs, 1)  # later keys, larger scores
    v = torch.randn(nkv, nb, bs, hd, generator=g)
    k, v = k.to(torch.bfloat16), v.to(torch.bfloat16)
    block_ids = torch.randperm(nb, generator=g)
    q = torch.randn(n, nkv * group, hd, generator=g) * 3
    got = cpu_kernels.paged_prefill(q, k, v, block_ids, start, hd**-0.5)
    used = q.to(torch.bfloat16).float() if cpu_kernels.gemm_bf16_supported() else q
    want = reference_prefill(used, k, v, block_ids, start, hd**-0.5)
    torch.testing.assert_close(got, want, atol=8e-3, rtol=0)


def test_a_long_context_over_many_kv_heads_lays_them_out_in_passes(amx):
    """A short chunk behind 8,000 cached positions over 16 KV heads of 128: more K/V than the
    AMX path lays out at once (32 MB), so its heads go in several passes; each head's outputs
    are still its own attention."""
    g = torch.Generator().manual_seed(5)
    nkv, group, hd, bs, start, n = 16, 1, 128, 16, 8000, 20
    nb = -(-(start + n) // bs)
    k, v = caches(nkv, nb, bs, hd, torch.bfloat16, g)
    block_ids = torch.randperm(nb, generator=g)
    q = torch.randn(n, nkv * group, hd, generator=g)
    got = cpu_kernels.paged_prefill(q, k, v, block_ids, start, hd**-0.5)
    used = q.to(torch.bfloat16).float() if cpu_kernels.gemm_bf16_supported() else q
    want = reference_prefill(used, k, v, block_ids, start, hd**-0.5)
    torch.testing.assert_close(got, want, atol=8e-3, rtol=0)


def test_an_empty_chunk_gives_an_empty_output(amx):
    g = torch.Generator().manual_seed(6)
    k, v = caches(3, 4, 16, 64, torch.bfloat16, g)
    got = cpu_kernels.paged_prefill(torch.randn(0, 9, 64), k, v, torch.arange(4), 0, 0.125)
    assert got.shape == (0, 9, 64)


@pytest.mark.parametrize("fmt", ["int8", "fp8"])
def test_paged_prefill_reads_a_quantized_cache_in_place(fmt):
    """Codes times their row's scale, as the torch gather dequantizes them."""
    from jobrunner.engine.quant.kv import KV_FORMATS, QuantizedKV

    g = torch.Generator().manual_seed(2)
    nkv, bs, hd, start, n = 3, 16, 64, 90, 45
    nb = -(-(start + n) // bs)
    pair = []
    for _ in range(2):
        c = QuantizedKV(KV_FORMATS[fmt], (nkv, nb, bs, hd), torch.float32, "cpu")
        c.write(torch.arange(nb * bs), torch.randn(nb * bs, nkv, hd, generator=g) * 3)
        pair.append(c)
    block_ids = torch.randperm(nb, generator=g)
    q = torch.randn(n, nkv * 3, hd, generator=g)
    got = cpu_kernels.paged_prefill(q, *pair, block_ids, start, 0.125)
    every = torch.arange(nb)
    plain = [c.gather(every).view(nkv, nb, bs, hd) for c in pair]
    want = reference_prefill(q, *plain, block_ids, start, 0.125)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("fmt", ["int8", "fp8"])
@pytest.mark.parametrize("hd,group", [(64, 3), (128, 8)])
def test_an_8_bit_cache_under_a_bfloat16_model_is_bfloat16_attention(fmt, hd, group, amx):
    """A bfloat16 model's 8-bit cache: with AMX on, the rows it attends are its codes times
    their scales rounded to bfloat16 (the tiles' input), queries and weights rounded as for a
    bfloat16 cache; within the same tolerance of float64 attention over those rounded rows,
    and not the float32 path's outputs (a float32 model's cache takes that one). With AMX off,
    the vector path reads codes times scales in float32. The cache is allocated unwritten and
    every slot the chunk does not see holds NaN: no path reads one."""
    from jobrunner.engine.quant.kv import KV_FORMATS, QuantizedKV

    g = torch.Generator().manual_seed(7)
    nkv, bs = 2, 16
    tiles = amx == "on"
    for start, n in [(0, 17), (90, 45), (0, 300), (200, 1)]:
        nb = -(-(start + n) // bs) + 3
        block_ids = torch.randperm(nb, generator=g)[: -(-(start + n) // bs)]
        pos = torch.arange(start + n)
        slots = block_ids[pos // bs] * bs + pos % bs
        pair = []
        for _ in range(2):
            c = QuantizedKV(KV_FORMATS[fmt], (nkv, nb, bs, hd), torch.bfloat16, "cpu", False)
            c.codes.fill_(0x7F)  # fp8: NaN
            c.scales.fill_(float("nan"))
            c.write(slots, torch.randn(start + n, nkv, hd, generator=g))
            pair.append(c)
        q = torch.randn(n, nkv * group, hd, generator=g)
        got = cpu_kernels.paged_prefill(q, *pair, block_ids, start, hd**-0.5)
        plain = [c.codes.view(c.fmt.storage).float() * c.scales.float() for c in pair]
        used = q
        if tiles:  # the rows as the tiles read them, and the queries
            plain, used = [p.bfloat16().float() for p in plain], q.bfloat16().float()
        want = reference_prefill(used, *plain, block_ids, start, hd**-0.5)
        tol = 8e-3 if tiles else 2e-5
        torch.testing.assert_close(got.float(), want, atol=tol, rtol=0, msg=f"{start=} {n=}")
        if tiles:  # the same cache under a float32 model: the float32 path, other outputs
            for c in pair:
                c.dtype = torch.float32
            other = cpu_kernels.paged_prefill(q, *pair, block_ids, start, hd**-0.5)
            assert (got.float() - other).abs().max() > 1e-4, f"{start=} {n=}"


def test_layouts_the_kernel_does_not_cover_are_left_to_torch():
    assert not cpu_kernels.prefill_supported(8, 8, 40)  # head_dim not 64 or 128
    assert not cpu_kernels.prefill_supported(18, 2, 64)  # 9 query heads per KV head
    assert not cpu_kernels.prefill_supported(10, 4, 64)  # heads not a multiple of KV heads
    with pytest.raises(ValueError, match="not supported"):
        q = torch.randn(3, 8, 40)
        k = torch.randn(8, 1, 16, 40)
        cpu_kernels.paged_prefill(q, k, k, torch.zeros(1, dtype=torch.long), 0, 0.1)
