"""Build a native kernel library once per source, compiler and CPU, into the kernel cache.

`-march=native` code (`-mcpu=native` on aarch64) must not run on another CPU, so the cache key
holds this CPU's feature flags with the sources, the compiler's version and its flags. A
concurrent build of the same key writes the same bytes, and the library appears by an atomic
rename. `JOBRUNNER_KERNEL_CFLAGS` adds flags after ours (a sanitizer build: scripts/asan_kernels.sh).
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from jobrunner.engine import first_use
from jobrunner.engine.resolve import writable_cache_dir
from jobrunner.telemetry.device import cpu_count

EXTRA_FLAGS_ENV = "JOBRUNNER_KERNEL_CFLAGS"


def build_library(name: str, sources: list[Path], headers: list[Path]) -> Path:
    """The cached `jobrunner-<name>-<key>.so` built from `sources` (RuntimeError if it fails)."""
    cc = _compiler()
    if cc is None:
        raise RuntimeError("no C compiler (cc) on PATH")
    key = library_key(sources, headers)
    target = writable_cache_dir() / "kernels" / f"jobrunner-{name}-{key[:16]}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with first_use.timed(), tempfile.TemporaryDirectory(dir=target.parent) as work:
        tmp = Path(work) / target.name
        _compile_and_link(cc, compile_flags(platform.machine()), sources, Path(work), tmp)
        os.replace(tmp, target)
    return target


def _compile_and_link(cc: str, flags: list[str], sources: list[Path], work: Path, out: Path):
    """Each source to an object file, as many compilers at a time as this process has cores,
    then one link: the first use on a 2-core Zen 4 built the CPU kernels in 21 s, against 37 s
    as one compiler run (paged_prefill.c and paged_decode.c take 20 s each)."""
    objects = [work / f"{i}-{src.stem}.o" for i, src in enumerate(sources)]
    compiles = [
        [cc, *flags, "-c", str(s), "-o", str(o)] for s, o in zip(sources, objects, strict=True)
    ]
    with ThreadPoolExecutor(max_workers=max(1, cpu_count())) as pool:
        list(pool.map(_run, compiles))  # the first failure raises
    _run([cc, *flags, *map(str, objects), "-o", str(out), "-lm"])


def _run(cmd: list[str]) -> None:
    # generous: on a loaded machine the -O3 build of every kernel specialisation took 100 s
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {done.stderr.strip()[-500:]}")


def compile_flags(machine: str) -> list[str]:
    """The compiler's flags for a shared kernel library built for this CPU, `machine` being
    platform.machine(). On aarch64: -mcpu=native, the form gcc and clang document there (it sets
    the architecture, its extensions and the tuning; some clang versions reject -march=native)."""
    native = "-mcpu=native" if machine.lower() in ("aarch64", "arm64") else "-march=native"
    extra = os.environ.get(EXTRA_FLAGS_ENV, "").split()  # after ours, so they win (-O1 over -O3)
    return ["-O3", native, "-shared", "-fPIC", "-fopenmp", *extra]


def library_key(sources: list[Path], headers: list[Path]) -> str:
    """What the built library's bytes depend on: the sources, the compiler's version and flags
    and this CPU's flags (also what a device profile's speed depends on: telemetry/profile.py)."""
    cc = _compiler()
    version = _compiler_version(cc) if cc else "no compiler"
    version += " ".join(compile_flags(platform.machine()))
    code = b"".join(src.read_bytes() for src in [*sources, *headers])
    return hashlib.sha256(code + version.encode() + cpu_flags()).hexdigest()


def _compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


@functools.cache
def _compiler_version(cc: str) -> str:
    return subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout


def cpu_flags() -> bytes:
    """This CPU's feature flags (Linux), else its processor and machine names."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line.encode()
    except OSError:
        pass
    return platform.processor().encode() + platform.machine().encode()
