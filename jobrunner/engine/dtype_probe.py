"""`model.dtype: auto` on a CPU, chosen by measurement: time the model's own linear shapes in
float32 and in bfloat16, each through the path the engine takes for it, and keep the faster,
once per CPU model, thread count, torch version, kernel build and model shape (the choice is
cached in the user's cache directory).

A rule cannot make this choice: on a Zen 5 (AVX-512 BF16, no AMX) a whole bf16 job ran twice as
fast as float32, because decode steps are memory-bound and bf16 halves the weight traffic, while
a large bf16 matmul alone ran at half float32's rate; on a Zen 3 (AVX2 only) bf16 is emulated
and every shape is several times slower. float32 is exact (the oracle's dtype), so bfloat16 must
win clearly (MARGIN) to be chosen.

The timing runs on one thread by its own CPU time, whatever the job's thread count: timed on
two threads by the wall clock on a 2-core Sapphire Rapids with another process running (load
3), a float32 decode pass took 10x its quiet time (a kernel's threads wait at every barrier
for the one the scheduler took away) and bfloat16, 2x faster on one thread, measured 0.70x as
fast: the wrong choice, cached for good. One thread's CPU time is what the other processes do
not inflate, and the two dtypes' ratio is the kernels', which scale alike over the cores.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from jobrunner.engine import first_use
from jobrunner.engine.resolve import cache_dir
from jobrunner.telemetry.device import cpu_family, cpu_name

log = logging.getLogger(__name__)

CACHE_FILE = "dtype_choice.json"
MARGIN = 1.15  # bfloat16 must be this much faster than float32 to be chosen
DECODE_ROWS = 32  # a decode step of a modest batch (memory-bound)
PREFILL_ROWS = 256  # a prefill chunk (compute-bound: one copy of the weights is enough)
TRAFFIC_BYTES = 64 << 20  # float32 weight bytes per decode pass, beyond most last-level caches
GIVE_UP = 3.0  # bfloat16 this much slower than float32 after a round cannot win
PROBE_VERSION = 3  # 3: one thread's CPU time; 2: packing untimed, alternating rounds
ROUNDS = 10  # timings of each dtype, alternating; the best of each part counts


@dataclass(frozen=True)
class DtypeChoice:
    dtype: str  # "float32" or "bfloat16"
    reason: str  # one line for the log and the report
    seconds_per_token: dict[str, float]  # candidate -> measured (decode + prefill) / 2


def choose_cpu_dtype(hidden: int, intermediate: int) -> DtypeChoice:
    """The faster dtype for a model of these linear shapes on this CPU (cached)."""
    import torch

    key = _key(hidden, intermediate, torch.get_num_threads(), torch.__version__)
    key += f"|kernels {_kernels_key()}|probe {PROBE_VERSION}"  # new kernels or probe: again
    cache = _read_cache()
    if key in cache:
        return DtypeChoice(**cache[key])
    with first_use.timed():
        choice = measure(hidden, intermediate)
    cache[key] = asdict(choice)
    _write_cache(cache)
    log.info("model.dtype auto: %s", choice.reason)
    return choice


def measure(hidden: int, intermediate: int) -> DtypeChoice:
    import torch

    if not _has_native_bf16():
        return DtypeChoice("float32", f"{_cpu()} has no bfloat16 instructions", {})
    per_token = _time_dtypes(hidden, intermediate)
    speedup = per_token["float32"] / per_token["bfloat16"]
    dtype = "bfloat16" if speedup >= MARGIN else "float32"
    reason = (
        f"measured on {_cpu()}, {torch.get_num_threads()} threads: bfloat16 runs this"
        f" model's linear layers {speedup:.2f}x as fast as float32"
        f" ({'chosen' if dtype == 'bfloat16' else f'below the {MARGIN}x needed to leave exact float32'})"
    )
    return DtypeChoice(dtype, reason, per_token)


def _time_dtypes(hidden: int, intermediate: int) -> dict[str, float]:
    """Each dtype's seconds per token (the mean of a decode step's and a prefill chunk's) on
    one thread, each part the best of ROUNDS rounds that alternate between the dtypes, so a
    burst of other work on the machine slows a round of both rather than one dtype's whole
    measurement."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the kernels take torch's thread count at each call
    try:
        return _alternate(hidden, intermediate)
    finally:
        torch.set_num_threads(threads)


def _alternate(hidden: int, intermediate: int) -> dict[str, float]:
    import torch

    runs = {
        "float32": _candidate(torch.float32, hidden, intermediate),
        "bfloat16": _candidate(torch.bfloat16, hidden, intermediate),
    }
    best = {name: [float("inf"), float("inf")] for name in runs}  # decode, prefill
    for _ in range(ROUNDS):
        for name, run in runs.items():
            best[name] = [min(b, t) for b, t in zip(best[name], run(), strict=True)]
        if sum(best["bfloat16"]) > GIVE_UP * sum(best["float32"]):
            break  # it cannot win
    return {name: sum(parts) / 2 for name, parts in best.items()}


def _candidate(dtype: Any, hidden: int, intermediate: int) -> Callable[[], tuple[float, float]]:
    """One timing of `dtype` (seconds per token of a decode step and of a prefill chunk over
    the model's MLP shapes) through the path the engine takes for it (float32: the packed
    small-row linear), its weights packed beforehand as the engine's are at load. Decode cycles
    through copies of the weights, so they come from memory as in a real step; prefill is
    compute-bound and uses one copy."""
    import torch
    import torch.nn.functional as F

    from jobrunner.engine.paged import cpu_kernels
    from jobrunner.engine.paged.small_linear import SmallRowLinear

    shapes = [(intermediate, hidden), (intermediate, hidden), (hidden, intermediate)]
    copies = max(1, TRAFFIC_BYTES // (sum(o * i for o, i in shapes) * 4))
    # the values do not change the speed (no denormals); filling is much faster than randn
    weights = [torch.full((o, i), 0.01, dtype=dtype) for _ in range(copies) for o, i in shapes]
    # float32 rows where the engine keeps them: float32 models, and bfloat16 ones whose weights
    # the bf16 kernel multiplies (model.PagedCausalLM.act_dtype)
    kernel = dtype == torch.float32 or cpu_kernels.gemm_bf16_supported()
    linear = SmallRowLinear() if kernel else F.linear
    rows_dtype = torch.float32 if kernel else dtype

    def rows(n: int) -> dict[int, Any]:
        return {k: torch.full((n, k), 0.5, dtype=rows_dtype) for k in (hidden, intermediate)}

    decode, prefill, one_row = rows(DECODE_ROWS), rows(PREFILL_ROWS), rows(1)
    for w in weights:  # packs every weight, untimed, and warms the code paths
        linear(one_row[w.shape[1]], w, None)

    def run() -> tuple[float, float]:
        step = _pass(weights, decode, linear) / DECODE_ROWS
        return step, _pass(weights[: len(shapes)], prefill, linear) / PREFILL_ROWS

    return run


def _pass(weights: list[Any], xs: dict[int, Any], linear: Any) -> float:
    """The calling thread's CPU seconds for one pass (the probe runs on one thread)."""
    t0 = time.thread_time()
    for w in weights:
        linear(xs[w.shape[1]], w, None)
    return time.thread_time() - t0


def _has_native_bf16() -> bool:
    """Whether the CPU computes in bfloat16 (AVX-512 BF16, AMX, or Arm's BF16 extension)."""
    try:
        flags = set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return False
    return bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})


def _key(hidden: int, intermediate: int, threads: int, torch_version: str) -> str:
    return f"{_cpu()}|{threads} threads|torch {torch_version}|{hidden}x{intermediate}"


def _kernels_key() -> str:
    from jobrunner.engine.native_build import library_key
    from jobrunner.engine.paged import cpu_kernels

    return library_key(cpu_kernels.SOURCES, cpu_kernels.HEADERS)[:12]


def _cpu() -> str:
    """A cloud VM's model name is often just "AMD EPYC": the microarchitecture tells them apart."""
    family = cpu_family()
    return f"{cpu_name()} ({family})" if family else cpu_name()


def _cache_path() -> Path:
    return cache_dir() / CACHE_FILE


def _read_cache() -> dict[str, Any]:
    try:
        data = json.loads(_cache_path().read_text(encoding="utf-8"))
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _write_cache(cache: dict[str, Any]) -> None:
    """Best effort: a cache that cannot be written means measuring again next time."""
    path = _cache_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(cache, indent=1, sort_keys=True), encoding="utf-8")
        tmp.replace(path)
    except OSError as e:
        log.warning("cannot cache the dtype choice in %s: %s", path, e)
