"""Device profiles: what runs on this machine measured, kept for the next estimate. No torch.

A profile belongs to one (device, model, compute dtype as resolved, weights and KV format,
engine, software) combination and lives in the cache (`$JOBRUNNER_CACHE/profiles/<key
digest>.json`, or $JOBRUNNER_PROFILE_DIR). `jobrunner estimate --calibrate N` and every
finished run add to it: the engine steps they measured (the newest MAX_STEPS), the model load
time, the time outside the steps per step and per row, and how much of its max_new_tokens an
EOS-honouring row generated. `jobrunner estimate` on the same device then
fits its step model to those steps instead of a spec-sheet guess.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import statistics
from collections import deque
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

MAX_STEPS = 4000  # newest steps kept: enough for a stable fit, small enough to refit at once
MAX_RUNS = 20  # newest per-run figures kept
KERNELS_ENV = "JOBRUNNER_CPU_KERNELS"  # "0": the paged engine's torch paths (cpu_kernels.py)
STEP_KEYS = (
    "prefill_tokens",
    "decode_tokens",
    "prefill_context_tokens",
    "batch_tokens",
    "kv_blocks_used",
    "step_seconds",
)


def profile_key(cfg, device, dtype: str) -> str:
    """What decides the speed of a step: the device, the model, the dtype it computes in
    (`dtype`: model.dtype as resolved, so that `auto` choosing bfloat16 on one run and float32
    on another keeps two profiles), its other formats, the engine, and the software that runs
    it (so a new torch or new kernels start a new profile)."""
    m, e = cfg.model, cfg.engine
    return "|".join(
        str(x)
        for x in (
            device.kind,
            device.name,
            device.family,
            device.count,
            m.source,
            dtype,
            m.quantization,
            m.kv_cache_dtype,
            e.kind,
            e.max_num_seqs,
            e.block_size,
            e.num_threads,
            software_key(device.kind),
        )
    )


@functools.cache
def software_key(device_kind: str) -> str:
    """torch's version and, on a CPU, the native kernels' library key (their sources, the
    compiler and this CPU's flags: engine/native_build.py), or that they are off."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        torch = f"torch {version('torch')}"
    except PackageNotFoundError:
        torch = "no torch"
    if device_kind != "cpu":
        return torch
    if os.environ.get(KERNELS_ENV, "1") == "0":
        return f"{torch}, kernels off"
    from jobrunner.engine import native_build

    csrc = Path(native_build.__file__).with_name("paged") / "csrc"
    key = native_build.library_key(sorted(csrc.glob("*.c")), sorted(csrc.glob("*.h")))
    return f"{torch}, kernels {key[:16]}"


@dataclass
class DeviceProfile:
    key: str
    steps: list[dict[str, Any]] = field(default_factory=list)
    load_seconds: list[float] = field(default_factory=list)
    outside_step_seconds_per_step: list[float] = field(default_factory=list)  # in the engine
    outside_engine_seconds_per_row: list[float] = field(default_factory=list)  # read, commit
    completion_fraction: list[float] = field(default_factory=list)  # EOS rows: used / max_new

    @property
    def load_s(self) -> float | None:
        return statistics.median(self.load_seconds) if self.load_seconds else None

    @property
    def step_overhead_s(self) -> float:
        v = self.outside_step_seconds_per_step
        return statistics.median(v) if v else 0.0

    @property
    def row_overhead_s(self) -> float | None:
        v = self.outside_engine_seconds_per_row
        return statistics.median(v) if v else None

    @property
    def completion_share(self) -> float | None:
        v = self.completion_fraction
        return statistics.median(v) if v else None

    def add_run(
        self,
        steps: Iterable[dict[str, Any]],
        load_seconds: float | None = None,
        engine_seconds: float | None = None,
        wall_seconds: float | None = None,
        rows: int = 0,
        completion_fraction: float | None = None,
    ) -> None:
        # one pass in bounded memory: the last MAX_STEPS timed steps, and the sum over all
        timed: deque[dict[str, Any]] = deque(maxlen=MAX_STEPS)
        step_total, n_timed = 0.0, 0
        for s in steps:
            if s.get("batch_tokens") and s.get("step_seconds") is not None:
                timed.append({k: s.get(k) for k in STEP_KEYS})
                step_total += s["step_seconds"]
                n_timed += 1
        self.steps = (self.steps + list(timed))[-MAX_STEPS:]
        if load_seconds is not None:
            _push(self.load_seconds, load_seconds)
        if engine_seconds is not None and timed:
            _push(self.outside_step_seconds_per_step, max(engine_seconds - step_total, 0) / n_timed)
        if wall_seconds is not None and engine_seconds is not None and rows:
            outside = wall_seconds - (load_seconds or 0.0) - engine_seconds
            _push(self.outside_engine_seconds_per_row, max(outside, 0.0) / rows)
        if completion_fraction is not None:
            _push(self.completion_fraction, completion_fraction)


def _push(values: list[float], v: float) -> None:
    values.append(float(v))
    del values[:-MAX_RUNS]


PROFILE_DIR_ENV = "JOBRUNNER_PROFILE_DIR"


def profiles_dir() -> Path:
    from jobrunner.engine.resolve import cache_dir

    return Path(os.environ.get(PROFILE_DIR_ENV) or cache_dir() / "profiles")


def _path(key: str) -> Path:
    return profiles_dir() / f"{hashlib.sha256(key.encode()).hexdigest()[:20]}.json"


def load_profile(key: str) -> DeviceProfile | None:
    path = _path(key)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return DeviceProfile(**data) if data.get("key") == key else None


def save_profile(profile: DeviceProfile) -> Path:
    """Atomically (a concurrent run's save wins whole, never half)."""
    path = _path(profile.key)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(asdict(profile)), encoding="utf-8")
    os.replace(tmp, path)
    return path


def record(key: str, **run: Any) -> Path:
    """Add one run's measurements to the profile for `key` (see DeviceProfile.add_run)."""
    profile = load_profile(key) or DeviceProfile(key)
    profile.add_run(**run)
    return save_profile(profile)
