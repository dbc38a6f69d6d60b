"""The CPU kernels built for aarch64 (their NEON path) with a cross compiler and the flags a
Graviton's build uses, run under qemu-aarch64 against torch on this machine: the few-row GEMM,
decode attention over every cache format, the norms, SiLU and RoPE. Correctness only: an
emulator says nothing about speed. Skips without aarch64-linux-gnu-gcc or qemu-aarch64."""

from __future__ import annotations

import shutil
import struct
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from attention_ref import reference_decode

from jobrunner.engine.native_build import compile_flags
from jobrunner.engine.paged import cpu_kernels
from jobrunner.engine.paged.model import rotate_half

CC, QEMU = shutil.which("aarch64-linux-gnu-gcc"), shutil.which("qemu-aarch64")
SYSROOT = "/usr/aarch64-linux-gnu"  # libc and libgomp of the Debian cross packages
DRIVER = Path(__file__).with_name("kernel_driver.c")
pytestmark = pytest.mark.skipif(
    CC is None or QEMU is None,
    reason="no aarch64 cross toolchain: apt-get install gcc-aarch64-linux-gnu "
    "libgomp1-arm64-cross qemu-user",
)

# a target: (the build's CPU flag in place of -mcpu=native, qemu's -cpu). Graviton2; Graviton3,
# whose SVE (256-bit) the compiler may use in plain loops; that build at 128-bit SVE (Graviton4)
TARGETS = {
    "neoverse-n1": ("-mcpu=neoverse-n1", "neoverse-n1"),
    "neoverse-v1-sve256": ("-mcpu=neoverse-v1", "max,sve-default-vector-length=32"),
    "neoverse-v1-sve128": ("-mcpu=neoverse-v1", "max,sve-default-vector-length=16"),
}
GEMM, DECODE, RMS_NORM, SILU_MUL, ROPE = 1, 2, 3, 4, 5  # kernel_driver.c's case kinds
# decode attention's (head_dim, query heads per KV head, block size)
LAYOUTS = [(64, 3, 16), (128, 8, 5), (36, 2, 16), (64, 1, 5), (128, 2, 7), (128, 5, 16)]
PANEL, THREADS = 16, 2  # NEON's panel width (small_gemm.c); OpenMP with 2 threads


@dataclass
class Case:
    name: str
    payload: bytes = field(repr=False)  # kernel_driver.c's case file
    want: torch.Tensor = field(repr=False)  # the float32 output, as torch computes it
    rtol: float
    atol: float


def _ints(*values: int) -> bytes:
    return struct.pack(f"<{len(values)}q", *values)


def _raw(*tensors: torch.Tensor) -> bytes:
    return b"".join(t.contiguous().view(torch.uint8).numpy().tobytes() for t in tensors)


def gemm_cases() -> list[Case]:
    """Widths off the 16-column panels and off a vector, strided rows, row counts around the
    5-row blocks and past a row slice, with and without a bias."""
    g, cases = torch.Generator().manual_seed(4), []
    for n, k in [(100, 70), (32, 576), (17, 1), (1, 33), (24, 9), (8, 16)]:
        w, b = torch.randn(n, k, generator=g), torch.randn(n, generator=g)
        packed = cpu_kernels.pack_gemm_weight(w, PANEL)
        for i, rows in enumerate((1, 4, 5, 6, 10, 13, 52, 1000)):
            wide = torch.randn(rows, 2 * k, generator=g)
            bias = b if i % 2 == 0 else None
            payload = _ints(GEMM, rows, n, k, 2 * k, bias is not None, THREADS)
            payload += _raw(wide, packed, *([bias] if bias is not None else []))
            want = F.linear(wide[:, :k].double(), w.double(), None if bias is None else b.double())
            cases.append(Case(f"gemm-{n}x{k}-{rows}", payload, want, 1e-5, 1e-5 * k**0.5))
    return cases


def _caches(kind: str, shape: tuple[int, ...], g: torch.Generator):
    """Two caches (K, V) of one format: (their bytes, float16 scales or None, dequantized)."""
    if kind in cpu_kernels.QUANTIZED:
        from jobrunner.engine.quant.kv import KV_FORMATS, QuantizedKV

        out = []
        for _ in range(2):
            c = QuantizedKV(KV_FORMATS[kind], shape, torch.float32, "cpu")
            slots = shape[1] * shape[2]
            c.write(torch.arange(slots), torch.randn(slots, shape[0], shape[3], generator=g) * 3)
            plain = c.gather(torch.arange(shape[1])).view(shape)
            out.append((c.codes, c.scales, plain))
        return out, cpu_kernels.QUANTIZED[kind]
    dtype = getattr(torch, kind)
    out = [(c, None, c.float()) for c in (torch.randn(shape, generator=g).to(dtype) for _ in "kv")]
    return out, cpu_kernels.DTYPES[dtype]


def decode_cases() -> list[Case]:
    """Every cache format; head_dim 64 and 128 with 1 to 8 query heads per KV head (the V
    pass's register blocks of 8, 4 and 2 vectors) and 36 (off the 8-value conversions: the
    plain loops); blocks of 16, 5 and 7 tokens; contexts of one token to several hundred."""
    g, cases = torch.Generator().manual_seed(0), []
    nkv, lens = 3, torch.tensor([1, 5, 16, 17, 100, 333])
    for kind in ("float32", "bfloat16", "float16", "int8", "fp8"):
        for hd, group, bs in LAYOUTS:
            nb = -(-int(lens.max()) // bs)
            num_blocks = len(lens) * nb + 3
            tables = torch.randperm(num_blocks, generator=g)[: len(lens) * nb].view(len(lens), nb)
            ((k, ks, kf), (v, vs, vf)), code = _caches(kind, (nkv, num_blocks, bs, hd), g)
            q = torch.randn(len(lens), nkv * group, hd, generator=g)
            sizes = (len(lens), nkv * group, nkv, hd, num_blocks, bs, nb, THREADS)
            payload = _ints(DECODE, code, k.element_size(), *sizes)
            payload += struct.pack("<f", hd**-0.5) + _raw(q, k, v)
            payload += _raw(ks, vs) if ks is not None else b""
            payload += _raw(tables, lens)
            want = reference_decode(q, kf, vf, tables, lens, hd**-0.5)
            cases.append(Case(f"decode-{kind}-{hd}x{group}", payload, want, 2e-5, 2e-5))
    return cases


def row_cases() -> list[Case]:
    """rms_norm and silu_mul on strided rows with tails off a vector, on one thread and on
    several (16 rows and up); RoPE bit for bit."""
    g, cases = torch.Generator().manual_seed(5), []
    for rows, d in [(1, 576), (20, 37), (3, 4)]:
        wide = torch.randn(rows, d + 9, generator=g) * 3
        w = torch.randn(d, generator=g)
        payload = _ints(RMS_NORM, rows, d, d + 9, THREADS) + struct.pack("<f", 1e-5)
        want = F.rms_norm(wide[:, :d], (d,), w, 1e-5)
        cases.append(Case(f"rms-{rows}x{d}", payload + _raw(wide, w), want, 2e-6, 2e-6))
    for rows, n in [(33, 1536), (2, 7)]:
        wide = torch.randn(rows, 2 * n + 5, generator=g) * 4
        wide[0, :n] = torch.linspace(-200, 200, n)  # far out on both sides: no overflow
        gate, up = wide[:, :n], wide[:, n : 2 * n]
        payload = _ints(SILU_MUL, rows, n, 2 * n + 5, THREADS) + _raw(wide)
        cases.append(Case(f"silu-{rows}x{n}", payload, F.silu(gate) * up, 2e-6, 1e-6))
    T, H, hd, max_len = 5, 3, 64, 40
    x = torch.randn(T, H * hd + 8, generator=g)  # rows with room past the heads
    cos, sin = torch.randn(max_len, hd, generator=g), torch.randn(max_len, hd, generator=g)
    pos = torch.randperm(max_len, generator=g)[:T]
    heads = x[:, : H * hd].view(T, H, hd)
    want = x.clone()
    want[:, : H * hd] = (heads * cos[pos, None] + rotate_half(heads) * sin[pos, None]).view(T, -1)
    payload = _ints(ROPE, T, H, hd, H * hd + 8, max_len, THREADS) + _raw(x, cos, sin, pos)
    cases.append(Case("rope", payload, want, 0.0, 0.0))
    return cases


def _run(cmd: list[str]) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{' '.join(cmd)}: {done.stderr[-2000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def drivers(tmp_path_factory) -> dict[str, Path]:
    """The kernels built as the engine builds them on aarch64 (its flags, -mcpu=native made a
    named CPU), linked with the driver: one build per CPU flag."""
    built = {}
    for flag in sorted({flag for flag, _ in TARGETS.values()}):
        where = tmp_path_factory.mktemp(flag.lstrip("-").replace("=", "-"))
        flags = [flag if f == "-mcpu=native" else f for f in compile_flags("aarch64")]
        lib = where / "libjobrunner-cpu.so"
        _run([CC, *flags, *map(str, cpu_kernels.SOURCES), "-o", str(lib), "-lm"])
        driver = where / "kernel_driver"
        _run([CC, "-O2", "-Wall", str(DRIVER), str(lib), f"-Wl,-rpath,{where}", "-o", str(driver)])
        built[flag] = driver
    return built


@pytest.fixture(scope="module")
def cases() -> list[Case]:
    return gemm_cases() + decode_cases() + row_cases()


def test_the_engine_builds_for_this_cpu_with_mcpu_native_on_aarch64():
    assert "-mcpu=native" in compile_flags("aarch64")
    assert "-march=native" in compile_flags("x86_64")


@pytest.mark.parametrize("target", TARGETS)
def test_neon_kernels_under_qemu_match_torch(target, drivers, cases, tmp_path):
    flag, cpu = TARGETS[target]
    qemu = [QEMU, "-cpu", cpu, "-L", SYSROOT, str(drivers[flag])]
    # the NEON path, its small GEMM on: the engine takes it (cpu_kernels.gemm_supported)
    assert _run([*qemu, "info"]).split() == ["neon", str(PANEL), "1"]
    paths = []
    for case in cases:
        paths.append(tmp_path / f"{case.name}.in")
        paths[-1].write_bytes(case.payload)
    _run([*qemu, *map(str, paths)])
    for case, path in zip(cases, paths, strict=True):
        out = bytearray(path.with_suffix(".out").read_bytes())
        got = torch.frombuffer(out, dtype=torch.float32)
        torch.testing.assert_close(
            got.view(case.want.shape).to(case.want.dtype), case.want, rtol=case.rtol,
            atol=case.atol, msg=lambda m, case=case: f"{target} {case.name}: {m}",
        )  # fmt: skip
