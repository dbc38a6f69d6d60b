"""The native CPU kernels against the torch code they replace."""

from __future__ import annotations

import platform

import pytest
import torch
from attention_ref import reference_decode

from jobrunner.engine.paged import cpu_kernels
from jobrunner.engine.paged.model import rotate_half

needs_kernels = pytest.mark.skipif(cpu_kernels.load() is None, reason="no C compiler")


@needs_kernels
@pytest.mark.parametrize(
    "dtype,tol", [(torch.float32, 2e-6), (torch.bfloat16, 2e-2), (torch.float16, 4e-3)]
)
@pytest.mark.parametrize("hd,group", [(64, 3), (128, 8), (40, 2)])  # AVX-512 paths and plain C
@pytest.mark.parametrize("bs", [16, 5])  # 16-token chunks that span blocks, or not
def test_paged_decode_matches_gathered_attention(dtype, tol, hd, group, bs):
    g = torch.Generator().manual_seed(0)
    nkv = 3
    lens = torch.tensor([1, 5, 16, 17, 100, 333])  # a partial block, exact blocks, one token
    nb = -(-int(lens.max()) // bs)
    num_blocks = len(lens) * nb + 10
    tables = torch.randperm(num_blocks, generator=g)[: len(lens) * nb].view(len(lens), nb)
    k_cache = torch.randn(nkv, num_blocks, bs, hd, generator=g).to(dtype)
    v_cache = torch.randn(nkv, num_blocks, bs, hd, generator=g).to(dtype)
    q = torch.randn(len(lens), nkv * group, hd, generator=g).to(dtype)
    got = cpu_kernels.paged_decode(q, k_cache, v_cache, tables, lens, hd**-0.5)
    want = reference_decode(q, k_cache, v_cache, tables, lens, hd**-0.5)
    assert got.dtype == dtype and got.shape == q.shape
    torch.testing.assert_close(got.float(), want, atol=tol, rtol=tol)


@needs_kernels
@pytest.mark.parametrize("fmt", ["int8", "fp8"])
@pytest.mark.parametrize("hd,group", [(64, 3), (128, 8), (40, 2)])
def test_paged_decode_reads_a_quantized_cache_in_place(fmt, hd, group):
    """Codes times their row's scale, as the torch gather dequantizes them."""
    from jobrunner.engine.quant.kv import KV_FORMATS, QuantizedKV

    g = torch.Generator().manual_seed(1)
    nkv, bs = 3, 16
    lens = torch.tensor([1, 15, 16, 17, 64, 65, 300])  # spans of 64 tokens, and their tails
    nb = -(-int(lens.max()) // bs)
    num_blocks = len(lens) * nb + 4
    tables = torch.randperm(num_blocks, generator=g)[: len(lens) * nb].view(len(lens), nb)
    caches = []
    for _ in range(2):
        c = QuantizedKV(KV_FORMATS[fmt], (nkv, num_blocks, bs, hd), torch.float32, "cpu")
        x = torch.randn(num_blocks * bs, nkv, hd, generator=g) * 3  # every slot written
        c.write(torch.arange(num_blocks * bs), x)
        caches.append(c)
    k_cache, v_cache = caches
    assert cpu_kernels.supports(k_cache)
    q = torch.randn(len(lens), nkv * group, hd, generator=g)
    got = cpu_kernels.paged_decode(q, k_cache, v_cache, tables, lens, hd**-0.5)
    every = torch.arange(num_blocks)
    k_plain = k_cache.gather(every).view(nkv, num_blocks, bs, hd)
    v_plain = v_cache.gather(every).view(nkv, num_blocks, bs, hd)
    want = reference_decode(q, k_plain, v_plain, tables, lens, hd**-0.5)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("hd,group", [(64, 3), (128, 8), (64, 1)])
def test_paged_decode_float32_queries_over_a_16_bit_cache(dtype, hd, group):
    """A float16 cache: float32 arithmetic on its values. A bfloat16 cache on AVX-512 BF16 (the
    mixed mode's decode): queries and softmax weights rounded to bfloat16 for vdpbf16ps, so
    against attention on the rounded queries within the weights' rounding (2^-9 of a value of
    about 1); elsewhere float32 arithmetic too."""
    g = torch.Generator().manual_seed(2)
    k_cache = torch.randn(3, 160, 16, hd, generator=g).to(dtype)
    v_cache = torch.randn(3, 160, 16, hd, generator=g).to(dtype)
    lens = torch.tensor([1, 7, 64, 65, 100, 190, 333])  # one token, spans of 64 and odd tails
    tables = torch.randperm(160, generator=g)[: 7 * 21].view(7, 21)
    q = torch.randn(7, 3 * group, hd, generator=g)
    got = cpu_kernels.paged_decode(q, k_cache, v_cache, tables, lens, hd**-0.5)
    assert got.dtype == torch.float32
    bf16_dot = dtype == torch.bfloat16 and cpu_kernels.gemm_bf16_supported()
    q_used = q.to(torch.bfloat16).float() if bf16_dot else q
    want = reference_decode(q_used, k_cache, v_cache, tables, lens, hd**-0.5)
    tol = 8e-3 if bf16_dot else 2e-5
    torch.testing.assert_close(got, want, atol=tol, rtol=0 if bf16_dot else tol)


@needs_kernels
def test_paged_decode_single_token_context_returns_its_value():
    k_cache = torch.randn(1, 4, 16, 8)
    v_cache = torch.randn(1, 4, 16, 8)
    q = torch.randn(1, 2, 8)
    tables = torch.tensor([[2]])
    got = cpu_kernels.paged_decode(q, k_cache, v_cache, tables, torch.tensor([1]), 0.5)
    assert torch.equal(got[0], v_cache[0, 2, 0].expand(2, 8))


@needs_kernels
def test_rope_is_bit_identical_to_rotate_half():
    g = torch.Generator().manual_seed(1)
    T, H, hd, max_len = 37, 12, 64, 512
    cos = torch.randn(max_len, hd, generator=g)
    sin = torch.randn(max_len, hd, generator=g)
    positions = torch.randint(0, max_len, (T,), generator=g)
    qkv = torch.randn(T, H + 3, hd, generator=g)  # the last 3 heads (V) must stay untouched
    x = qkv[:, :H]
    want = x * cos[positions, None] + rotate_half(x) * sin[positions, None]
    v_before = qkv[:, H:].clone()
    assert cpu_kernels.rope_supported(x.dtype, x.device)
    got = cpu_kernels.rope_(x, cos, sin, positions)
    assert got.data_ptr() == x.data_ptr()
    assert torch.equal(got, want)
    assert torch.equal(qkv[:, H:], v_before)


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T", [5, 300])  # a decode step; a prefill (the parallel branch)
def test_rope_and_kv_write_in_one_pass_give_the_bits_of_the_two_steps(dtype, T):
    """Rotating q and k in the fused projection and writing the new K/V in one pass leaves the
    same projection and the same cache, to the bit, as rope_ then write_kv_: subnormals,
    values that round past the largest bfloat16, infinities and NaN included; heads past the
    K/V rows and every other slot untouched."""
    g = torch.Generator().manual_seed(4)
    nh, nkv, hd, bs, num_blocks, max_len = 6, 2, 64, 4, 100, 512
    cos, sin = torch.randn(max_len, hd, generator=g), torch.randn(max_len, hd, generator=g)
    positions = torch.randint(0, max_len, (T,), generator=g)
    qkv = torch.randn(T, nh + 2 * nkv, hd, generator=g)
    edge = torch.tensor([1e-39, -3e-40, 3.4e38, float("inf"), float("nan"), -0.0, 1.0000001])
    qkv[0, nh, : edge.numel()] = edge  # a K row: rotated, mixing them in
    qkv[-1, -1, : edge.numel()] = edge  # a V row: stored as it is
    slots = torch.randperm(num_blocks * bs, generator=g)[:T]
    caches = [torch.randn(nkv, num_blocks, bs, hd, generator=g).to(dtype) for _ in range(2)]
    want_qkv, want = qkv.clone(), [c.clone() for c in caches]
    cpu_kernels.rope_(want_qkv[:, : nh + nkv], cos, sin, positions)
    cpu_kernels.write_kv_(*want, slots, want_qkv[:, nh : nh + nkv], want_qkv[:, nh + nkv :])
    assert cpu_kernels.rope_kv_write_(qkv, nh, cos, sin, positions, *caches, slots)
    bits = torch.int32 if dtype == torch.float32 else torch.int16
    assert torch.equal(qkv.view(torch.int32), want_qkv.view(torch.int32))
    for got, exp in zip(caches, want, strict=True):
        assert torch.equal(got.view(bits), exp.view(bits))


@needs_kernels
def test_rope_and_kv_write_decline_what_they_do_not_write():
    """A float16 cache, or a projection whose heads are not contiguous, is left to the two
    steps: nothing is rotated or written."""
    nh, nkv, hd = 2, 1, 64
    cos = sin = torch.ones(8, hd)
    qkv = torch.randn(3, nh + 2 * nkv, hd)
    before = qkv.clone()
    half = [torch.zeros(nkv, 2, 4, hd, dtype=torch.float16) for _ in range(2)]
    assert not cpu_kernels.rope_kv_write_(
        qkv, nh, cos, sin, torch.arange(3), *half, torch.arange(3)
    )
    wide = torch.randn(3, nh + 2 * nkv, 2 * hd)[..., :hd]  # head stride 2 hd
    plain = [torch.zeros(nkv, 2, 4, hd) for _ in range(2)]
    assert not cpu_kernels.rope_kv_write_(
        wide, nh, cos, sin, torch.arange(3), *plain, torch.arange(3)
    )
    assert torch.equal(qkv, before) and all(not c.any() for c in half + plain)


def test_kernels_can_be_switched_off(monkeypatch):
    monkeypatch.setenv("JOBRUNNER_CPU_KERNELS", "0")
    cpu_kernels.load.cache_clear()
    try:
        assert cpu_kernels.load() is None
        assert not cpu_kernels.supports(torch.zeros(1, 1, 1, 1))
        assert not cpu_kernels.rope_supported(torch.float32, torch.device("cpu"))
    finally:
        monkeypatch.delenv("JOBRUNNER_CPU_KERNELS")
        cpu_kernels.load.cache_clear()


def test_a_failed_build_falls_back_with_a_reason(monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    monkeypatch.setenv("JOBRUNNER_CACHE", str(tmp_path))
    cpu_kernels.load.cache_clear()
    try:
        with caplog.at_level("INFO"):
            assert cpu_kernels.load() is None
        assert "CPU kernels unavailable" in caplog.text
    finally:
        monkeypatch.undo()
        cpu_kernels.load.cache_clear()


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86 compiler flags")
def test_a_build_without_vector_instructions_keeps_the_torch_paths(monkeypatch, tmp_path, caplog):
    """The plain C build (what aarch64 or an x86 CPU without AVX2 gets): it says so, the few-row
    linears and prefill attention stay in torch, and its decode attention is still right."""
    cc = tmp_path / "cc-scalar"
    cc.write_text('#!/bin/sh\nexec cc "$@" -mno-avx2 -mno-avx512f\n')
    cc.chmod(0o755)
    monkeypatch.setenv("CC", str(cc))
    monkeypatch.setenv("JOBRUNNER_CACHE", str(tmp_path))
    cpu_kernels.load.cache_clear()
    try:
        with caplog.at_level("INFO"):
            assert cpu_kernels.load() is not None
        assert cpu_kernels.isa() == "scalar"
        assert cpu_kernels.TORCH_WITHOUT_VECTORS in caplog.text
        assert not cpu_kernels.gemm_supported()
        assert not cpu_kernels.prefill_supported(9, 3, 64)
        g = torch.Generator().manual_seed(7)
        lens = torch.tensor([1, 9, 40])
        k_cache, v_cache = torch.randn(2, 2, 9, 16, 64, generator=g)  # (nkv 2, 9 blocks)
        tables = torch.arange(9).view(3, 3)
        q = torch.randn(3, 6, 64, generator=g)
        got = cpu_kernels.paged_decode(q, k_cache, v_cache, tables, lens, 0.125)
        want = reference_decode(q, k_cache, v_cache, tables, lens, 0.125)
        torch.testing.assert_close(got, want, atol=2e-6, rtol=2e-6)
    finally:
        monkeypatch.undo()
        cpu_kernels.load.cache_clear()


@pytest.mark.parametrize("native", [True, False], ids=["kernel", "onednn"])
def test_small_row_linear_matches_f_linear_and_repacks_a_new_weight(native, monkeypatch):
    from jobrunner.engine.paged.small_linear import SmallRowLinear

    if native and not cpu_kernels.gemm_supported():
        pytest.skip("no vector kernel (AVX-512 or AVX2) on this CPU")
    if not native and not torch.backends.mkldnn.is_available():
        pytest.skip("no oneDNN")
    monkeypatch.setattr(cpu_kernels, "gemm_supported", lambda: native)
    g = torch.Generator().manual_seed(2)
    lin = SmallRowLinear()
    w, b = torch.randn(96, 64, generator=g), torch.randn(96, generator=g)
    limit = SmallRowLinear.ONEDNN_MAX_ROWS  # the kernel takes every row count (a prefill step)
    for rows in (1, 7, limit, limit + 1) if not native else (1, 7, 1030):
        x = torch.randn(rows, 64, generator=g)
        torch.testing.assert_close(lin(x, w, b), torch.nn.functional.linear(x, w, b))
    assert len(lin.packed) == 1  # packed once, reused
    w2 = torch.randn(96, 64, generator=g)  # a different weight never gets w's packing
    x = torch.randn(4, 64, generator=g)
    torch.testing.assert_close(lin(x, w2, None), torch.nn.functional.linear(x, w2))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_model_off_the_cpu_never_builds_the_cpu_kernels(dtype, monkeypatch):
    """A CUDA job has no use for the CPU linears: asking whether they fit must not compile the
    kernels (seconds of a C compiler on a fresh machine). A model on the meta device stands in
    for one on a GPU."""
    from jobrunner.engine.paged.small_linear import SmallRowLinear

    def build(*_a):
        raise AssertionError("the CPU kernels were asked for")

    for name in ("load", "gemm_supported", "gemm_bf16_supported"):
        monkeypatch.setattr(cpu_kernels, name, build)
    with torch.device("meta"):
        model = torch.nn.Linear(8, 8, dtype=dtype)
    assert not SmallRowLinear.usable(model)


@pytest.mark.skipif(not cpu_kernels.gemm_supported(), reason="no vector kernel on this CPU")
@pytest.mark.parametrize("n,k", [(100, 70), (32, 576), (17, 1), (1, 33), (24, 9), (8, 16)])
def test_small_gemm_matches_f_linear_at_every_row_block_and_panel_edge(n, k):
    """Row counts around the row blocks (14 rows with AVX-512, 6 with AVX2), output widths off
    the panels (32 or 16 columns) and off a vector (16 or 8), and an input read through a row
    stride (the gate half of a fused gate/up projection)."""
    g = torch.Generator().manual_seed(4)
    w, b = torch.randn(n, k, generator=g), torch.randn(n, generator=g)
    packed = cpu_kernels.pack_gemm_weight(w)
    for rows in (1, 5, 6, 7, 13, 14, 15, 29, 52, 256, 1000):  # 1,000: several row slices
        wide = torch.randn(rows, 2 * k, generator=g)
        x = wide[:, :k]  # strided rows
        for bias in (b, None):
            got = cpu_kernels.small_gemm(x, packed, bias, n)
            want = torch.nn.functional.linear(
                x.double(), w.double(), None if bias is None else bias.double()
            )
            torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5 * k**0.5)


@pytest.mark.skipif(not cpu_kernels.gemm_supported(), reason="no vector kernel on this CPU")
@pytest.mark.parametrize("n,k", [(100, 70), (576, 1536)])
def test_a_float32_rows_bits_do_not_depend_on_how_the_threads_split_its_step(n, k):
    """A row's float32 linear is the same bits whether the threads split the step's rows or its
    panels, and whether it shares its step with 1,000 rows or 6."""
    g = torch.Generator().manual_seed(12)
    w, b = torch.randn(n, k, generator=g), torch.randn(n, generator=g)
    packed = cpu_kernels.pack_gemm_weight(w)
    x = torch.randn(1001, k + 5, generator=g)[:, :k]  # strided rows, an odd count
    split, threads = cpu_kernels.gemm_split_rows(), torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        cpu_kernels.gemm_split_rows(1)  # every step split by rows
        by_rows = cpu_kernels.small_gemm(x, packed, b, n)
        cpu_kernels.gemm_split_rows(10**6)  # every step split by panels
        assert torch.equal(cpu_kernels.small_gemm(x, packed, b, n), by_rows)
        pieces = [cpu_kernels.small_gemm(x[i : i + 6], packed, b, n) for i in range(0, 1001, 6)]
        assert torch.equal(torch.cat(pieces), by_rows)
    finally:
        cpu_kernels.gemm_split_rows(split)
        torch.set_num_threads(threads)


@pytest.fixture
def bf16_path(amx):
    """Each bfloat16 linear path this CPU has: vdpbf16ps (AMX off), and AMX tiles for steps
    of 16 rows or more where Linux grants them."""
    if not cpu_kernels.gemm_bf16_supported():
        pytest.skip("no AVX-512 BF16 on this CPU")
    return "amx" if amx == "on" else "vdpbf16ps"


@pytest.mark.parametrize(
    "n,k",
    [(100, 70), (32, 576), (17, 1), (1, 33), (24, 9), (40, 577), (100, 64), (577, 1536), (33, 32)],
)
def test_small_gemm_bf16_is_exact_on_bfloat16_rounded_rows(bf16_path, n, k):
    """bfloat16 weights times float32 rows rounded to bfloat16 (as torch rounds them), summed in
    float32: equal to the float64 product of the same bfloat16 values within float32 rounding,
    on each path, at row counts around the 14-row blocks, the 16-row tiles, the 32-row AMX
    blocks and the row slices, widths off the 32-column panels, odd K (the pair's zero half),
    K a multiple of 32 (the AMX tiles' k step) and not, strided rows."""
    g = torch.Generator().manual_seed(5)
    w = torch.randn(n, k, generator=g).to(torch.bfloat16)
    b = torch.randn(n, generator=g)
    packed = cpu_kernels.pack_gemm_weight_bf16(w)
    for rows in (1, 5, 13, 14, 15, 16, 17, 29, 31, 32, 33, 52, 300, 1000):
        x = torch.randn(rows, 2 * k, generator=g)[:, :k]
        for bias in (b, None):
            got = cpu_kernels.small_gemm_bf16(x, packed, bias, n)
            want = x.to(torch.bfloat16).double() @ w.double().T
            want = want if bias is None else want + bias.double()
            torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5 * k**0.5)


@pytest.mark.parametrize(
    "n,k", [(32, 64), (1536, 576), (96, 1536), (48, 64), (64, 70), (32, 33), (64, 1)]
)
def test_fused_gate_up_silu_gives_the_linear_then_the_product_bit_for_bit(bf16_path, n, k):
    """silu(gate) * up straight from a fused gate/up weight equals the linear and then silu_mul
    exactly (a row's tokens do not depend on which ran), on the AMX tiles (steps of their rows,
    n and K multiples of 32) and on vdpbf16ps (every other step, any K, the 7-row blocks), with
    and without a bias, strided rows, at row counts around the blocks and past the rows kept in
    L2, from float32 rows and from the bfloat16 rows they round to; n off the 32-column
    panels declines (None: the caller runs the two)."""
    g = torch.Generator().manual_seed(6)
    w = (torch.randn(2 * n, k, generator=g) / k**0.5).to(torch.bfloat16)
    b = torch.randn(2 * n, generator=g)
    packed = cpu_kernels.pack_gemm_weight_bf16(w)
    for rows in (1, 6, 7, 8, 15, 16, 17, 32, 33, 300, 1000):
        x = (torch.randn(rows, 2 * k, generator=g) * 3)[:, :k]  # strided rows
        for bias in (b, None):
            got = cpu_kernels.small_gemm_bf16_silu(x, packed, bias, n)
            if n % 32:
                assert got is None
                continue
            want = cpu_kernels.silu_mul(cpu_kernels.small_gemm_bf16(x, packed, bias, 2 * n))
            assert got.dtype == torch.bfloat16  # the down projection's rows
            assert torch.equal(got, want.to(torch.bfloat16)), (rows, bias is None)
            strided = torch.empty(rows, 2 * k, dtype=torch.bfloat16)[:, :k].copy_(x)
            rounded = cpu_kernels.small_gemm_bf16_silu(strided, packed, bias, n)
            assert torch.equal(rounded, got), (rows, bias is None)
    with pytest.raises(ValueError):  # a weight packed for other outputs: nothing read past it
        cpu_kernels.small_gemm_bf16_silu(x, packed, None, n + 32)
    with pytest.raises(ValueError):  # a bias of the gate half only
        cpu_kernels.small_gemm_bf16_silu(x, packed, b[:n], n)


@pytest.mark.parametrize("n,k", [(100, 64), (577, 1536), (33, 32), (40, 70)])
def test_bfloat16_rows_give_the_bits_of_the_float32_rows_they_were_rounded_from(bf16_path, n, k):
    """A linear handed bfloat16 rows (a norm or the gate/up product rounded them as they were
    made) returns exactly what it returns for the float32 rows: read in place on AMX tiles (the
    last rows of a 32-row block from a padded copy: nothing past the tensor is read) and as
    vdpbf16ps's k pairs (masked: nothing past a row's K); strided rows, row counts around the
    14-, 16- and 32-row blocks."""
    g = torch.Generator().manual_seed(7)
    w = torch.randn(n, k, generator=g).to(torch.bfloat16)
    b = torch.randn(n, generator=g)
    packed = cpu_kernels.pack_gemm_weight_bf16(w)
    for rows in (1, 13, 14, 15, 16, 17, 31, 32, 33, 47, 300, 1000):
        x = torch.randn(rows, 2 * k, generator=g).to(torch.bfloat16)[:, :k]  # strided
        for bias in (b, None):
            want = cpu_kernels.small_gemm_bf16(x.float(), packed, bias, n)
            got = cpu_kernels.small_gemm_bf16(x, packed, bias, n)
            assert got.dtype == torch.float32 and torch.equal(got, want), (rows, bias is None)
    # one row repeated without a copy (row stride 0): the rows are copied out, not overrun
    row = torch.randn(1, k, generator=g).to(torch.bfloat16)
    got = cpu_kernels.small_gemm_bf16(row.expand(33, k), packed, b, n)
    assert torch.equal(got, cpu_kernels.small_gemm_bf16(row.float().expand(33, k), packed, b, n))


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_write_kv_puts_strided_rows_into_their_slots(dtype):
    """K and V sliced from a fused qkv projection (strided rows) land where index_copy_ puts
    them, and nothing else in the cache changes."""
    g = torch.Generator().manual_seed(3)
    nh, nkv, hd, bs, num_blocks = 6, 2, 64, 4, 9
    qkv = torch.randn(300, nh + 2 * nkv, hd, generator=g).to(dtype)
    k, v = qkv[:, nh : nh + nkv], qkv[:, nh + nkv :]  # (T, nkv, hd), row stride (nh + 2 nkv) hd
    slots = torch.randperm(num_blocks * bs, generator=g)[:7]
    for rows in (slice(0, 7), slice(0, 300)):  # a decode step; a prefill (the parallel branch)
        n = rows.stop
        if n > slots.numel():
            num_blocks = -(-n // bs)
            slots = torch.randperm(num_blocks * bs, generator=g)[:n]
        caches = [torch.randn(nkv, num_blocks, bs, hd, generator=g).to(dtype) for _ in range(2)]
        want = [c.clone() for c in caches]
        for c, x in zip(want, (k[rows], v[rows]), strict=True):
            c.view(nkv, -1, hd).index_copy_(1, slots, x.transpose(0, 1))
        cpu_kernels.write_kv_(*caches, slots, k[rows], v[rows])
        assert all(torch.equal(a, b) for a, b in zip(caches, want, strict=True))


@needs_kernels
@pytest.mark.parametrize("fmt", ["int8", "fp8"])
def test_write_kv_quantizes_into_the_same_codes_and_scales_as_torch(fmt):
    """The native 8-bit write fills exactly the codes and scales QuantizedKV.write does, for
    strided rows of a fused projection, decode and prefill."""
    from jobrunner.engine.quant.kv import KV_FORMATS, QuantizedKV

    g = torch.Generator().manual_seed(4)
    nh, nkv, hd, bs, num_blocks = 6, 2, 64, 16, 40
    qkv = torch.randn(300, nh + 2 * nkv, hd, generator=g) * 4
    qkv[5, nh] = 0.0  # an all-zero row: the scale's floor
    k, v = qkv[:, nh : nh + nkv], qkv[:, nh + nkv :]
    for n in (7, 300):
        slots = torch.randperm(num_blocks * bs, generator=g)[:n]
        shape = (nkv, num_blocks, bs, hd)
        ours = [QuantizedKV(KV_FORMATS[fmt], shape, torch.float32, "cpu") for _ in range(2)]
        torch_ = [QuantizedKV(KV_FORMATS[fmt], shape, torch.float32, "cpu") for _ in range(2)]
        cpu_kernels.write_kv_(*ours, slots, k[:n], v[:n])
        for c, x in zip(torch_, (k[:n], v[:n]), strict=True):
            c.write(slots, x)
        for a, b in zip(ours, torch_, strict=True):
            assert torch.equal(a.codes, b.codes) and torch.equal(a.scales, b.scales)


@needs_kernels
@pytest.mark.parametrize("d", [576, 40, 7])  # whole vectors, a tail, only a tail
@pytest.mark.parametrize("rows", [3, 64])  # one thread, and rows split across threads
def test_rms_norm_matches_torch_on_strided_rows(d, rows):
    g = torch.Generator().manual_seed(5)
    x = (torch.randn(rows, d + 9, generator=g) * 3)[:, :d]  # rows read through a stride
    w = torch.randn(d, generator=g)
    got = cpu_kernels.rms_norm(x, w, 1e-5)
    want = torch.nn.functional.rms_norm(x, (d,), w, 1e-5)
    torch.testing.assert_close(got, want, rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("n,k", [(100, 64), (576, 1536), (33, 32), (40, 70)])
def test_a_linear_added_into_a_residual_in_place_gives_the_bits_of_the_add(bf16_path, n, k):
    """y += x W^T + b added block by block as the kernel makes it (AMX tiles, or vdpbf16ps
    for every other step) equals the linear and then `y += it` bit for bit, float32 and
    bfloat16 rows, y a strided view (a row tile of a wider stream), with and without a bias,
    partial row blocks and panels, nothing past the view touched."""
    g = torch.Generator().manual_seed(9)
    w = torch.randn(n, k, generator=g).to(torch.bfloat16)
    b = torch.randn(n, generator=g)
    packed = cpu_kernels.pack_gemm_weight_bf16(w)
    for rows in (1, 13, 14, 15, 16, 17, 33, 300):
        x = torch.randn(rows, k + 3, generator=g)[:, :k]  # strided rows
        for rows_dtype, bias in ((torch.float32, b), (torch.bfloat16, None)):
            xr = torch.empty(rows, k + 3, dtype=rows_dtype)[:, :k].copy_(x)
            stream = torch.randn(rows, n + 5, generator=g) * 4
            y = stream[:, :n]
            want = y + cpu_kernels.small_gemm_bf16(xr, packed, bias, n)
            before = stream.clone()
            assert cpu_kernels.small_gemm_bf16_add_(y, xr, packed, bias, n), rows
            assert torch.equal(y, want), (rows, rows_dtype)
            assert torch.equal(stream[:, n:], before[:, n:])  # nothing past the view
    with pytest.raises(ValueError):  # a stream wider than the weight's outputs
        cpu_kernels.small_gemm_bf16_add_(torch.zeros(300, n + 64), x.float(), packed, None, n)
    with pytest.raises(ValueError):  # a weight packed for other outputs than n
        cpu_kernels.small_gemm_bf16_add_(torch.zeros(300, n + 64), x.float(), packed, None, n + 64)


@pytest.mark.parametrize("n,k", [(100, 70), (576, 1536), (64, 576)])
def test_a_rows_bits_do_not_depend_on_how_the_threads_split_its_step(n, k):
    """On vdpbf16ps a row's outputs (the linear, the linear added into a stream, silu(gate) *
    up) are the same bits whether the threads split the step's rows (each its own slices) or
    its panels, and whether the row shares its step with 1,000 others or 6: a row's tokens do
    not depend on the batch it rode in."""
    if not cpu_kernels.gemm_bf16_supported():
        pytest.skip("no AVX-512 BF16 on this CPU")
    g = torch.Generator().manual_seed(11)
    w = (torch.randn(2 * n, k, generator=g) / k**0.5).to(torch.bfloat16)
    b = torch.randn(2 * n, generator=g)
    packed, packed_n = (
        cpu_kernels.pack_gemm_weight_bf16(w),
        cpu_kernels.pack_gemm_weight_bf16(w[:n]),
    )
    x = torch.randn(1001, k + 5, generator=g)[:, :k]  # strided rows, an odd count
    stream = torch.randn(1001, n, generator=g)
    ops = {  # each on rows i .. j of x
        "linear": lambda i, j: cpu_kernels.small_gemm_bf16(x[i:j], packed_n, b[:n], n),
        "added": lambda i, j: _added(stream[i:j], x[i:j], packed_n, b[:n], n),
        "silu": lambda i, j: cpu_kernels.small_gemm_bf16_silu(x[i:j], packed, b, n),
    }
    if n % 32:  # off the 32-column panels: the fused product declines (tested above)
        del ops["silu"]
    amx, split, threads = (
        cpu_kernels.amx_rows(),
        cpu_kernels.gemm_split_rows(),
        torch.get_num_threads(),
    )
    try:
        cpu_kernels.amx_rows(0)
        torch.set_num_threads(2)
        for name, op in ops.items():
            cpu_kernels.gemm_split_rows(1)  # every step split by rows
            by_rows = op(0, 1001)
            cpu_kernels.gemm_split_rows(10**6)  # every step split by panels
            assert torch.equal(op(0, 1001), by_rows), name
            pieces = torch.cat([op(i, i + 6) for i in range(0, 1001, 6)])
            assert torch.equal(pieces, by_rows), name
    finally:
        cpu_kernels.amx_rows(amx)
        cpu_kernels.gemm_split_rows(split)
        torch.set_num_threads(threads)


def _added(stream, x, packed, bias, n):
    y = stream.clone()
    assert cpu_kernels.small_gemm_bf16_add_(y, x, packed, bias, n)
    return y


@needs_kernels
@pytest.mark.parametrize("d", [576, 40, 7])
def test_rms_norm_rounded_to_bfloat16_is_the_float32_norm_rounded(d):
    """The norm's bfloat16 rows (for a linear that reads them in place) are its float32 rows
    rounded to nearest even, bit for bit (no subnormals here, which the kernels flush)."""
    g = torch.Generator().manual_seed(8)
    x = (torch.randn(40, d + 9, generator=g) * 3)[:, :d]
    w = torch.randn(d, generator=g)
    got = cpu_kernels.rms_norm(x, w, 1e-5, torch.bfloat16)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, cpu_kernels.rms_norm(x, w, 1e-5).to(torch.bfloat16))


@needs_kernels
@pytest.mark.parametrize("n", [1536, 40, 7])
def test_silu_mul_matches_torch_without_overflow(n):
    """Gate values far out on both sides must give finite products (e^-g overflows for g << 0
    if computed naively)."""
    g = torch.Generator().manual_seed(6)
    rows = 33
    gu = torch.randn(rows, 2 * n + 5, generator=g)[:, : 2 * n] * 4  # a strided fused row
    gu[0, :n] = torch.linspace(-200, 200, n)
    got = cpu_kernels.silu_mul(gu)
    gate, up = gu.split(n, dim=-1)
    want = torch.nn.functional.silu(gate) * up
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("native", [True, False])
def test_a_float16_cache_saturates_instead_of_storing_inf(native):
    """A float32 model's K/V beyond float16's range land as +-65504 (finite), on the native copy
    and on the torch write alike; in range they are plainly rounded to float16."""
    from jobrunner.engine.paged.attention import _write

    if native and cpu_kernels.load() is None:
        pytest.skip("no C compiler")
    k = torch.tensor([[[1e6, -1e6, 1.5, 70000.0]]])  # (T=1, nkv=1, hd=4)
    caches = [torch.zeros(1, 2, 2, 4, dtype=torch.float16) for _ in range(2)]
    slots = torch.tensor([3])
    if native:
        cpu_kernels.write_kv_(*caches, slots, k, k)
    else:
        for c in caches:
            _write(c, slots, k)
    for c in caches:
        assert c.view(-1, 4)[3].tolist() == [65504.0, -65504.0, 1.5, 65504.0]


@needs_kernels
def test_fp8_write_rounds_every_code_and_tie_as_torch_does():
    """Rows whose absmax is 448 have scale 1, so each value is converted as given: every e4m3
    value, every midpoint between neighbours (ties go to the even code), and the floats just
    either side of each midpoint, subnormals included, with both signs."""
    from jobrunner.engine.quant.kv import KV_FORMATS, QuantizedKV

    codes = torch.arange(127, dtype=torch.uint8).view(torch.float8_e4m3fn).float()  # 0 .. 448
    mids = (codes[:-1] + codes[1:]) / 2
    up, down = torch.tensor(float("inf")), torch.tensor(0.0)
    vals = torch.cat([codes, mids, torch.nextafter(mids, up), torch.nextafter(mids, down)])
    vals = torch.cat([vals, -vals])
    per_row = 63
    vals = torch.cat([vals, vals.new_zeros(-len(vals) % per_row)]).view(-1, per_row)
    rows = torch.cat([vals, vals.new_full((len(vals), 1), 448.0)], dim=1)  # (R, 64)
    x = rows.view(-1, 1, 64)  # (T, nkv=1, hd=64)
    slots = torch.arange(len(rows))
    shape = (1, -(-len(rows) // 16), 16, 64)
    ours = [QuantizedKV(KV_FORMATS["fp8"], shape, torch.float32, "cpu") for _ in range(2)]
    ref = QuantizedKV(KV_FORMATS["fp8"], shape, torch.float32, "cpu")
    cpu_kernels.write_kv_(*ours, slots, x, x)
    ref.write(slots, x)
    assert torch.equal(ours[0].scales, ref.scales)
    bad = (ours[0].codes != ref.codes).nonzero()
    assert not len(bad), [rows[b * 16 + p, d].item() for _, b, p, d in bad[:5].tolist()]


@needs_kernels
@pytest.mark.parametrize("rows,vocab", [(64, 49152), (1, 300), (3, 1)])
def test_row_max_gives_torch_max_s_maximum_and_first_index(rows, vocab):
    """Greedy sampling's argmax (cpu_kernels.row_max) is torch.max(dim=-1)'s: the first of tied
    maxima, the first of +0.0/-0.0, the first NaN where a row holds one, +inf and all -inf rows
    as torch has them; the maxima finite exactly where torch's are."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(rows, vocab, generator=g)
    if rows >= 8:
        x[3, 100] = x[3, 5000] = 99.0
        x[4] = -0.0
        x[4, 7] = 0.0
        x[5, 300] = x[5, 200] = float("nan")
        x[6, 9] = float("inf")
        x[7] = float("-inf")
    x[-1, -1] = 1e9  # a maximum at the very end
    best, index = x.max(dim=-1)
    got_best, got_index = cpu_kernels.row_max(x)
    assert got_index.tolist() == index.tolist()
    assert torch.equal(torch.isfinite(got_best), torch.isfinite(best))
    assert torch.equal(got_best.nan_to_num(), best.nan_to_num())
    strided = torch.cat([x, x], dim=1)[:, :vocab]  # rows at another stride
    assert cpu_kernels.row_max(strided)[1].tolist() == index.tolist()
