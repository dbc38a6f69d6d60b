"""The native CPU kernels against their rooflines and the torch code they replace, in one run.

At SmolLM2-135M's shapes (hidden 576, 9 query heads on 3 KV heads of 64, MLP 1536, 30 layers):
  peak     the CPU's float32 peak: cores x one core's measured rate on independent FMA chains
           (FMA_PROBE), printed beside the ISA's cores x clock x lanes x 2 FMA units x 2 (the
           clock measured by a chain of dependent adds), which Zen 4's split 512-bit FMAs halve
  gemm     one step's linears (30 layers' q/k/v, o, gate/up, down on distinct weights, so they
           come from memory as in a real step) for a few row counts: our kernel against oneDNN's
           prepacked linear and F.linear (and, where the threads split a step's rows, against
           itself with the panels shared instead); GFLOP/s and weight bytes/s, against a torch
           sum over the same weight bytes (the memory roofline a reduction reaches)
  decode   decode attention over a float32, a float16 and (AVX-512 BF16) a bfloat16 cache: our
           kernel against the torch path (gather + SDPA); cache bytes/s against a torch sum
           over the same bytes
  prefill  prefill attention of chunks from position 0: our kernel against torch's flash
           attention for CPU; GFLOP/s and the share of the peak; over a bfloat16 cache too (the
           mixed mode's), with AMX off and on, against the bfloat16 peak
  rows     RMSNorm and SiLU-gated product against torch's ops, bytes/s

On a machine shared with other work, time with --threads 1 (the default): each measurement
is then the thread's own CPU time, which other processes do not inflate (the peak is per core
then too). --busy-cores N makes such work on purpose (a spinning process on each of the last N
CPUs), to time how the kernels share a step among threads of unequal speed. --baseline-lib
PATH times another build of csrc/ (e.g. an older commit's) alongside.

    python scripts/bench_kernels.py
    python scripts/bench_kernels.py --only gemm,decode --baseline-lib /tmp/old.so
    python scripts/bench_kernels.py --threads 2 --only gemm-bf16 --busy-cores 1 --baseline-lib ...
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import shutil
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

from jobrunner.engine import heap
from jobrunner.engine.paged import cpu_kernels

LAYERS, HIDDEN, MLP, VOCAB = 30, 576, 1536, 49152
NH, NKV, HD = 9, 3, 64
LANES = {"avx512": 16, "avx2": 8, "neon": 4, "scalar": 4}  # float32 lanes a vector (scalar: SSE)

CLOCK_PROBE = r"""
#include <stdint.h>
/* 8 dependent register adds an iteration: one cycle each, so cycles = 8 * iterations (adds of
 * an immediate would not do: Golden Cove folds chains of them at rename, several a cycle). */
int64_t spin(int64_t n) {
    int64_t x = 0, one = 1;
    for (int64_t i = 0; i < n; i++)
        __asm__ volatile("add %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\t"
                         "add %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\tadd %1, %0"
                         : "+r"(x) : "r"(one));
    return x;
}
"""

# Independent multiply-add chains on the widest vector the kernels use, enough to cover the
# latency of every FMA pipe: their rate is the core's real peak, which the ISA alone does not
# give (Zen 4 runs a 512-bit FMA as two 256-bit halves: half the lanes x units product).
FMA_PROBE = r"""
#include <stdint.h>
#include <immintrin.h>
/* Named accumulators (an array's would live in memory): 24 with AVX-512's 32 registers, 12
 * with AVX2's 16. */
#define EACH12(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
#if defined(__AVX512F__)
#define EACH(X) EACH12(X) X(12) X(13) X(14) X(15) X(16) X(17) X(18) X(19) X(20) X(21) X(22) X(23)
#define CHAINS 24
typedef __m512 vec;
#define SET1 _mm512_set1_ps
#define FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define ADD _mm512_add_ps
#define LANES 16
#else
#define EACH EACH12
#define CHAINS 12
typedef __m256 vec;
#define SET1 _mm256_set1_ps
#define FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define ADD _mm256_add_ps
#define LANES 8
#endif
#define DECL(c) vec acc##c = SET1((float)c);
#define SUM(c) t = ADD(t, acc##c);
static void store(vec t, float *sink) {
    float out[LANES];
    __builtin_memcpy(out, &t, sizeof out);
    *sink = out[0];
}
/* flops done: n iterations of CHAINS vector FMAs (2 flops a lane) */
double fma_f32(int64_t n, float *sink) {
    vec a = SET1(1.0f + 1e-7f), b = SET1(1e-7f), t = SET1(0.0f);
    EACH(DECL)
#define STEP(c) acc##c = FMA(acc##c, a, b);
    for (int64_t i = 0; i < n; i++) { EACH(STEP) }
    EACH(SUM)
    store(t, sink);
    return (double)n * CHAINS * LANES * 2;
}
#if defined(__AVX512BF16__)
/* flops done: n iterations of CHAINS vdpbf16ps (32 products + 32 adds into 16 lanes) */
double dot_bf16(int64_t n, float *sink) {
    __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80), b = (__m512bh)_mm512_set1_epi16(0x3380);
    vec t = SET1(0.0f);
    EACH(DECL)
#define DOT(c) acc##c = _mm512_dpbf16_ps(acc##c, a, b);
    for (int64_t i = 0; i < n; i++) { EACH(DOT) }
    EACH(SUM)
    store(t, sink);
    return (double)n * CHAINS * 64;
}
#endif
#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__linux__)
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
/* flops done: n iterations of 4 independent tdpbf16ps (16 x 16 x 32 multiply-adds each) on
 * tiles that stay loaded; -1 when Linux does not grant the tile state. */
double amx_bf16(int64_t n, float *sink) {
    if (syscall(SYS_arch_prctl, 0x1023, 18) != 0) return -1.0;
    struct { uint8_t palette, start_row, reserved[14]; uint16_t colsb[16]; uint8_t rows[16]; } c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 8; t++) c.rows[t] = 16, c.colsb[t] = 64;
    _tile_loadconfig(&c);
    static uint16_t ones[16 * 32] __attribute__((aligned(64)));
    for (int i = 0; i < 16 * 32; i++) ones[i] = 0x3f80;
    float out[16 * 16];
    _tile_loadd(4, ones, 64); _tile_loadd(5, ones, 64); _tile_loadd(6, ones, 64);
    _tile_loadd(7, ones, 64);
    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
    for (int64_t i = 0; i < n; i++) {
        _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, out, 64);
    _tile_release();
    *sink = out[0];
    return (double)n * 4 * 16 * 16 * 32 * 2;
}
#endif
"""


class Clock:
    """Wall time with several threads; with one, the thread's own CPU time (not inflated by
    other processes sharing the cores)."""

    def __init__(self, threads: int):
        self.now = time.thread_time if threads == 1 else time.perf_counter

    def best(self, fn, reps: int = 3) -> float:
        fn()  # warm: packing, first-touch pages, caches
        times = []
        for _ in range(reps):
            t = self.now()
            fn()
            times.append(self.now() - t)
        return min(times)


def clock_ghz() -> float | None:
    """The core clock, measured: None off x86-64 or without a C compiler."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None or os.uname().machine not in ("x86_64", "AMD64"):
        return None
    with tempfile.TemporaryDirectory() as tmp:
        src, so = Path(tmp, "probe.c"), Path(tmp, "probe.so")
        src.write_text(CLOCK_PROBE)
        subprocess.run([cc, "-O1", "-shared", "-fPIC", str(src), "-o", str(so)], check=True)
        spin = ctypes.CDLL(str(so)).spin
        spin.argtypes, spin.restype = [ctypes.c_int64], ctypes.c_int64
        n, best = 20_000_000, float("inf")
        for _ in range(5):
            t = time.thread_time()
            spin(n)
            best = min(best, time.thread_time() - t)
        return 8 * n / best / 1e9


def measured_core_flops(bf16: bool = False, amx: bool = False) -> float | None:
    """One core's FLOP/s on independent FMA chains (vdpbf16ps with `bf16`, AMX tiles with
    `amx`), by the thread's CPU time: None off x86-64 with AVX2, without a C compiler, or
    without the instructions."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None or cpu_kernels.isa() not in ("avx512", "avx2"):
        return None
    with tempfile.TemporaryDirectory() as tmp:
        src, so = Path(tmp, "fma.c"), Path(tmp, "fma.so")
        src.write_text(FMA_PROBE)
        cmd = [cc, "-O3", "-march=native", "-shared", "-fPIC", str(src), "-o", str(so)]
        subprocess.run(cmd, check=True)
        lib = ctypes.CDLL(str(so))
        name = "amx_bf16" if amx else "dot_bf16" if bf16 else "fma_f32"
        if not hasattr(lib, name):
            return None
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = [ctypes.c_int64, ctypes.POINTER(ctypes.c_float)], ctypes.c_double
        sink, best = ctypes.c_float(), 0.0
        for _ in range(5):
            t = time.thread_time()
            flops = fn(200_000 if amx else 2_000_000, ctypes.byref(sink))
            if flops < 0:
                return None
            best = max(best, flops / max(time.thread_time() - t, 1e-9))
        return best


def nominal_ghz() -> float | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("cpu MHz"):
                return float(line.split(":")[1]) / 1000
    except OSError:
        pass
    return None


def peak_flops(cores: int, bf16: bool = False) -> tuple[float, str]:
    """FLOP/s peak of `cores` cores for the kernels' ISA, and how it was found: float32 FMAs,
    or with `bf16` the bfloat16 path the kernels take: AMX tiles where they run
    (cpu_kernels.amx_rows(): 16 x 16 x 32 multiply-adds a tdpbf16ps, 1,024 flops a cycle by
    the ISA), else vdpbf16ps, two multiply-adds a float32 lane. Where the probe runs, the
    measured rate of one core times the cores (the ISA's formula is printed beside it: the two
    differ where a core splits wide vectors, as Zen 4 does); elsewhere the formula."""
    isa = cpu_kernels.isa() or "scalar"
    ghz, how = clock_ghz(), "measured"
    if ghz is None:
        ghz, how = nominal_ghz() or 2.0, "nominal"
    amx = bf16 and cpu_kernels.amx_rows() > 0
    if amx:
        per_cycle, unit = 1024, "flops a cycle (AMX tdpbf16ps, steps of many rows)"
    else:
        lanes = LANES[isa] * (2 if bf16 else 1)
        per_cycle = lanes * 2 * 2
        unit = ("bfloat16 pairs (vdpbf16ps)" if bf16 else f"lanes ({isa})") + " x 2 FMA units x 2"
        unit = f"{lanes} {unit}"
    formula = cores * ghz * 1e9 * per_cycle
    by_isa = f"{cores} cores x {ghz:.2f} GHz ({how}) x " + (f"{per_cycle} {unit}" if amx else unit)
    core = measured_core_flops(bf16, amx)
    what = "AMX tile products" if amx else "FMA chains"
    if core is None:
        return formula, f"{by_isa} = {formula / 1e9:.0f} GFLOP/s"
    peak = cores * core
    note = (
        f"{cores} cores x {core / 1e9:.0f} GFLOP/s (independent {what} on one core:"
        f" {core / (ghz * 1e9):.0f} flops a cycle at {ghz:.2f} GHz) = {peak / 1e9:.0f} GFLOP/s;"
        f" by the ISA {by_isa} = {formula / 1e9:.0f}"
    )
    return peak, note


def reduction_gbs(tensors: list[torch.Tensor], clock: Clock) -> float:
    """Bytes/s a torch sum reaches over the same bytes: the memory roofline for a kernel that
    reads them once."""
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    return nbytes / clock.best(lambda: [t.sum() for t in tensors]) / 1e9


def bench_gemm(clock: Clock, rows: list[int], baseline=None) -> None:
    shapes = [(NH * HD + 2 * NKV * HD, HIDDEN), (HIDDEN, HIDDEN), (2 * MLP, HIDDEN), (HIDDEN, MLP)]
    g = torch.Generator().manual_seed(0)
    weights = [torch.randn(n, k, generator=g) * 0.02 for _ in range(LAYERS) for n, k in shapes]
    flops_per_row = 2 * sum(w.numel() for w in weights)
    wbytes = 4 * sum(w.numel() for w in weights)
    print(f"\n[gemm] one step's linears ({len(weights)} weights, {wbytes / 1e6:.0f} MB float32)")
    print(f"  torch sum over the weight bytes: {reduction_gbs(weights, clock):.1f} GB/s")
    ours = (
        [cpu_kernels.pack_gemm_weight(w) for w in weights] if cpu_kernels.gemm_supported() else None
    )
    onednn = None
    if torch.backends.mkldnn.is_available():
        onednn = [torch.ops.mkldnn._reorder_linear_weight(w, None) for w in weights]
    for m in rows:
        xs = {k: torch.randn(m, k, generator=g) for k in (HIDDEN, MLP)}
        paths = {"F.linear": partial(_linears, _f_linear, xs, weights, weights)}
        if onednn is not None:
            paths["oneDNN packed"] = partial(_linears, _onednn, xs, weights, onednn)
        if ours is not None:
            paths["kernel"] = partial(_linears, _kernel, xs, weights, ours)
            if m >= torch.get_num_threads() * cpu_kernels.gemm_split_rows():  # rows split: and not
                shared = partial(_linears, _kernel, xs, weights, ours)
                paths["panels shared"] = partial(_with_split_rows, 10**9, shared)
            if baseline is not None:
                paths["baseline build"] = partial(
                    _with, baseline, _linears, _kernel, xs, weights, ours
                )
        cells = []
        for name, fn in paths.items():
            s = clock.best(fn)
            cells.append(f"{name} {s * 1e3:6.1f} ms {flops_per_row * m / s / 1e9:5.1f} GF/s")
            if m <= 16:
                cells[-1] += f" {wbytes / s / 1e9:5.1f} GB/s"
        print(f"  {m:4d} rows: " + " | ".join(cells), flush=True)


def bench_gemm_bf16(clock: Clock, rows: list[int], peak: float, baseline=None) -> None:
    """bfloat16 weights: torch's F.linear on bfloat16 rows (oneDNN) against our vdpbf16ps kernel
    on float32 rows (rounded to bfloat16 inside) and, where the CPU has them, our AMX tiles at
    every row count, against `peak`, the bfloat16 peak of the path the kernels take (one
    vdpbf16ps does 32 multiply-adds where an FMA does 16; AMX: peak_flops)."""
    if not cpu_kernels.gemm_bf16_supported():
        print("\n[gemm-bf16] skipped: no AVX-512 BF16 kernel on this CPU")
        return
    shapes = [(NH * HD + 2 * NKV * HD, HIDDEN), (HIDDEN, HIDDEN), (2 * MLP, HIDDEN), (HIDDEN, MLP)]
    g = torch.Generator().manual_seed(0)
    weights = [
        (torch.randn(n, k, generator=g) * 0.02).to(torch.bfloat16)
        for _ in range(LAYERS)
        for n, k in shapes
    ]
    flops_per_row = 2 * sum(w.numel() for w in weights)
    wbytes = 2 * sum(w.numel() for w in weights)
    print(f"\n[gemm-bf16] the same linears in bfloat16 ({wbytes / 1e6:.0f} MB)")
    ours = [cpu_kernels.pack_gemm_weight_bf16(w) for w in weights]
    amx = cpu_kernels.amx_rows()
    if amx:
        print(f"  (the kernel takes AMX from {amx} rows; here each path at every row count)")
    for m in rows:
        x32 = {k: torch.randn(m, k, generator=g) for k in (HIDDEN, MLP)}
        x16 = {k: v.to(torch.bfloat16) for k, v in x32.items()}
        paths = {
            "F.linear bf16": partial(_linears, _f_linear, x16, weights, weights),
            "vdpbf16ps": partial(_with_amx_rows, 0, _linears, _kernel_bf16, x32, weights, ours),
        }
        if m >= torch.get_num_threads() * cpu_kernels.gemm_split_rows():  # rows split: and not
            shared = partial(_with_amx_rows, 0, _linears, _kernel_bf16, x32, weights, ours)
            paths["panels shared"] = partial(_with_split_rows, 10**9, shared)
        if baseline is not None:
            paths["baseline build"] = partial(
                _with, baseline, _with_amx_rows, 0, _linears, _kernel_bf16, x32, weights, ours
            )
        if amx:
            paths["AMX"] = partial(_with_amx_rows, 1, _linears, _kernel_bf16, x32, weights, ours)
        cells = []
        for name, fn in paths.items():
            s = clock.best(fn)
            rate = flops_per_row * m / s
            cells.append(f"{name} {s * 1e3:6.1f} ms {rate / 1e9:5.1f} GF/s {rate / peak:4.0%}")
            if m <= 16:
                cells[-1] += f" {wbytes / s / 1e9:5.1f} GB/s"
        print(f"  {m:4d} rows: " + " | ".join(cells), flush=True)


def _with_amx_rows(rows: int, fn, *args) -> None:
    """fn(*args) with the kernels' AMX threshold at `rows` (0: AMX off), then as it was."""
    before = cpu_kernels.amx_rows()
    cpu_kernels.amx_rows(rows)
    try:
        fn(*args)
    finally:
        cpu_kernels.amx_rows(before)


def _with_split_rows(rows: int, fn) -> None:
    """fn() with the linear kernels splitting steps by rows from `rows` rows a thread, then as
    it was (10**9: every step's panels shared among the threads)."""
    before = cpu_kernels.gemm_split_rows()
    cpu_kernels.gemm_split_rows(rows)
    try:
        fn()
    finally:
        cpu_kernels.gemm_split_rows(before)


def _kernel_bf16(x, w, p):
    return cpu_kernels.small_gemm_bf16(x, p, None, w.shape[0])


def _linears(linear, xs, weights, packed) -> None:
    for w, p in zip(weights, packed, strict=True):
        linear(xs[w.shape[1]], w, p)


def _f_linear(x, w, _):
    return F.linear(x, w)


def _onednn(x, _, p):
    return torch.ops.mkldnn._linear_pointwise(x, p, None, "none", [], "")


def _kernel(x, w, p):
    return cpu_kernels.small_gemm(x, p, None, w.shape[0])


def decode_case(rows: int, ctx: int, dtype: torch.dtype, bs: int = 16):
    g = torch.Generator().manual_seed(1)
    nb = -(-ctx // bs)
    num_blocks = rows * nb
    k = torch.randn(NKV, num_blocks, bs, HD, generator=g).to(dtype)
    v = torch.randn(NKV, num_blocks, bs, HD, generator=g).to(dtype)
    tables = torch.randperm(num_blocks, generator=g).view(rows, nb)
    lens = torch.full((rows,), ctx, dtype=torch.int64)
    q = torch.randn(rows, NH, HD, generator=g)
    return q, k, v, tables, lens


def torch_decode(q, k, v, tables, lens):
    """The torch path: each row's context gathered, padded to the longest, SDPA (GQA folded)."""
    from jobrunner.engine.paged.attention import DecodeGroup, _decode

    b = q.shape[0]
    bs = k.shape[2]
    mask = torch.arange(tables.shape[1] * bs)[None, :] < lens[:, None]
    group = DecodeGroup(0, b, tables, lens, mask.view(b, 1, 1, -1))
    return _decode(q, k, v, group, HD**-0.5)


def bench_decode(clock: Clock, baseline) -> None:
    print("\n[decode] one layer's decode attention, SmolLM2 heads, block size 16")
    dtypes = [torch.float32, torch.float16]
    if cpu_kernels.gemm_bf16_supported():  # the mixed mode's cache, on vdpbf16ps
        dtypes.append(torch.bfloat16)
    for dtype in dtypes:
        for rows, ctx in ((52, 540), (256, 300), (16, 2000)):
            q, k, v, tables, lens = decode_case(rows, ctx, dtype)
            nbytes = 2 * k.numel() * k.element_size()
            roof = reduction_gbs([k, v], clock)
            case = (q, k, v, tables, lens)
            paths = {
                "torch gather+SDPA": partial(torch_decode, *case),
                "kernel": partial(cpu_kernels.paged_decode, *case, HD**-0.5),
            }
            if baseline is not None:
                paths["baseline build"] = partial(
                    _with, baseline, cpu_kernels.paged_decode, *case, HD**-0.5
                )
            cells = []
            for name, fn in paths.items():
                s = clock.best(fn)
                cells.append(f"{name} {s * 1e3:6.2f} ms {nbytes / s / 1e9:5.1f} GB/s")
            name = str(dtype).removeprefix("torch.")
            print(
                f"  {name:<8} {rows:3d} rows x {ctx:4d} tokens ({nbytes / 1e6:4.0f} MB,"
                f" torch sum {roof:5.1f} GB/s): " + " | ".join(cells),
                flush=True,
            )


def prefill_flops(n: int) -> float:
    """Causal attention FLOPs of an n-token chunk from position 0 (QK^T and PV, the half of the
    score matrix a causal kernel computes)."""
    return 2 * 2 * NH * HD * n * (n + 1) / 2


def bench_prefill(clock: Clock, peak: float, bf16_peak: float | None, baseline) -> None:
    print("\n[prefill] one layer's prefill attention of a chunk from position 0")
    if bf16_peak:
        print("  (float32 cache against the float32 peak; bfloat16 cache, as the mixed mode runs")
        print("   it, against the bfloat16 peak: AMX off, and on where the CPU has the tiles)")
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    for n in (128, 512, 2048):
        g = torch.Generator().manual_seed(2)
        bs = 16
        nb = -(-n // bs)
        k = torch.randn(NKV, nb, bs, HD, generator=g)
        v = torch.randn(NKV, nb, bs, HD, generator=g)
        ids = torch.arange(nb)
        q = torch.randn(n, NH, HD, generator=g)
        qt = q.transpose(0, 1).unsqueeze(0)  # (1, nh, n, hd)
        kt = k.reshape(NKV, -1, HD)[:, :n].repeat_interleave(NH // NKV, 0).unsqueeze(0)
        vt = v.reshape(NKV, -1, HD)[:, :n].repeat_interleave(NH // NKV, 0).unsqueeze(0)
        paths = {"torch flash": (partial(flash, qt, kt, vt, 0.0, True, scale=HD**-0.5), peak)}
        case = (q, k, v, ids, 0, HD**-0.5)
        if cpu_kernels.prefill_supported(NH, NKV, HD):
            paths["kernel"] = (partial(cpu_kernels.paged_prefill, *case), peak)
            if bf16_peak:
                bf16 = (q, k.bfloat16(), v.bfloat16(), ids, 0, HD**-0.5)
                amx = cpu_kernels.amx_rows()
                paths["bf16 cache"] = (
                    partial(_with_amx_rows, 0, cpu_kernels.paged_prefill, *bf16),
                    bf16_peak,
                )
                if amx:
                    run = partial(_with_amx_rows, amx, cpu_kernels.paged_prefill, *bf16)
                    paths["bf16 cache, AMX"] = (run, bf16_peak)
        if baseline is not None and baseline.paged_prefill_supports(NH, NKV, HD):
            run = partial(_with, baseline, cpu_kernels.paged_prefill, *case)
            paths["baseline build"] = (run, peak)
        cells = []
        for name, (fn, top) in paths.items():
            s = clock.best(fn)
            rate = prefill_flops(n) / s
            cells.append(f"{name} {s * 1e3:7.2f} ms {rate / 1e9:6.1f} GF/s {rate / top:4.0%}")
        print(f"  {n:5d} tokens: " + " | ".join(cells), flush=True)


def bench_rows(clock: Clock, baseline) -> None:
    print("\n[rows] RMSNorm (576) and SiLU x up (2 x 1536) over 4096 rows")
    g = torch.Generator().manual_seed(3)
    x, w = torch.randn(4096, HIDDEN, generator=g), torch.randn(HIDDEN, generator=g)
    gu = torch.randn(4096, 2 * MLP, generator=g)
    gate, up = gu.split(MLP, dim=-1)
    cases = {
        "rms_norm": (
            2 * x.numel() * 4,
            {
                "torch": lambda: F.rms_norm(x, (HIDDEN,), w, 1e-5),
                "kernel": lambda: cpu_kernels.rms_norm(x, w, 1e-5),
            },
            lambda: _with(baseline, cpu_kernels.rms_norm, x, w, 1e-5),
        ),
        "silu_mul": (
            (gu.numel() + gate.numel()) * 4,
            {
                "torch": lambda: F.silu(gate) * up,
                "kernel": lambda: cpu_kernels.silu_mul(gu),
            },
            lambda: _with(baseline, cpu_kernels.silu_mul, gu),
        ),
    }
    for what, (nbytes, paths, base) in cases.items():
        if baseline is not None:
            paths["baseline build"] = base
        cells = []
        for name, fn in paths.items():
            s = clock.best(fn)
            cells.append(f"{name} {s * 1e3:6.2f} ms {nbytes / s / 1e9:5.1f} GB/s")
        print(f"  {what}: " + " | ".join(cells), flush=True)


def _with(lib, fn, *args):
    """fn (a cpu_kernels wrapper) run on another build of the kernels."""
    real = cpu_kernels.load
    cpu_kernels.load = lambda: lib
    try:
        return fn(*args)
    finally:
        cpu_kernels.load = real


def load_baseline(path: str):
    """Another build of csrc/ (any commit's): the entry points these benchmarks call."""
    lib = ctypes.CDLL(path)
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    lib.paged_decode.argtypes = [ptr] * 5 + [ctypes.c_int, ptr, i64, ptr]
    lib.paged_decode.argtypes += [i64] * 6 + [ctypes.c_float, ptr, ctypes.c_int]
    # today's signature (an older build ignores the arguments it does not take)
    lib.paged_prefill.argtypes = cpu_kernels.load().paged_prefill.argtypes
    lib.paged_prefill_supports.argtypes = [i64] * 3
    lib.rms_norm.argtypes = [ptr, i64, ptr, ctypes.c_float, ptr, i64, i64, ctypes.c_int]
    lib.silu_mul.argtypes = [ptr, i64, ptr, i64, i64, ctypes.c_int]
    ours = cpu_kernels.load()
    for name in (
        "small_gemm",
        "small_gemm_bf16",
        "small_gemm_split_rows",
        "small_gemm_bf16_amx_rows",
    ):
        getattr(lib, name).argtypes = getattr(ours, name).argtypes
        getattr(lib, name).restype = getattr(ours, name).restype
    return lib


@contextlib.contextmanager
def busy_cores(n: int):
    """n processes spinning, each pinned to one of the last n CPUs this process may use, for the
    block: another workload on the cores (a neighbour on a shared node), under which the kernels'
    split of a step among the threads shows (a thread that shares its core runs slower)."""
    cpus = sorted(os.sched_getaffinity(0))[-n:] if n > 0 else []
    spin = [sys.executable, "-c", "while True: pass"]
    procs = [subprocess.Popen(spin, preexec_fn=partial(os.sched_setaffinity, 0, {c})) for c in cpus]
    if procs:
        print(f"busy: a spinning process pinned to each of CPUs {cpus}")
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--only", default="peak,gemm,gemm-bf16,decode,prefill,rows")
    p.add_argument("--gemm-rows", default="1,16,52,128,256,512,1024")
    p.add_argument("--baseline-lib", default=None, help="another build of csrc/ to time alongside")
    p.add_argument(
        "--busy-cores", type=int, default=0, help="spinning processes pinned to the last N CPUs"
    )
    args = p.parse_args()
    with busy_cores(args.busy_cores):
        run(args)


def run(args) -> None:
    torch.set_num_threads(args.threads)
    clock = Clock(args.threads)
    if cpu_kernels.load() is None:
        raise SystemExit("the CPU kernels did not build (see the log)")
    baseline = load_baseline(args.baseline_lib) if args.baseline_lib else None
    only = set(args.only.split(","))
    peak, note = peak_flops(args.threads)
    print(f"kernels: {cpu_kernels.isa()}; threads {args.threads}; peak {note}")
    kept = heap.keep_freed_memory()  # as make_engine does on CPU: outputs reuse freed pages
    print(f"heap: freed memory {'kept' if kept else 'returned (fresh pages each call)'}")
    if "gemm" in only:
        bench_gemm(clock, [int(r) for r in args.gemm_rows.split(",")], baseline)
    bf16_peak = None
    if {"gemm-bf16", "prefill"} & only and cpu_kernels.gemm_bf16_supported():
        bf16_peak, bf16_note = peak_flops(args.threads, bf16=True)
        print(f"bfloat16 peak {bf16_note}")
    if "gemm-bf16" in only:  # it says why it skips on a CPU without AVX-512 BF16
        rows = [int(r) for r in args.gemm_rows.split(",")]
        bench_gemm_bf16(clock, rows, bf16_peak or 0.0, baseline)
    if "decode" in only:
        bench_decode(clock, baseline)
    if "prefill" in only:
        bench_prefill(clock, peak, bf16_peak, baseline)
    if "rows" in only:
        bench_rows(clock, baseline)


if __name__ == "__main__":
    main()
