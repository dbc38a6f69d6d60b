"""Detect the accelerator (through NVML, no torch) or the host CPU the job runs on."""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path


@dataclass(frozen=True)
class DeviceInfo:
    kind: str  # "cuda" | "cpu"
    name: str  # "NVIDIA H200" | "Intel(R) Xeon(R) Processor"
    count: int  # GPUs, or CPU cores available to this process

    def __str__(self) -> str:
        unit = "GPU" if self.kind == "cuda" else "core"
        return f"{self.count} x {self.name} ({unit}{'s' if self.count != 1 else ''})"


@lru_cache(maxsize=1)
def detect_device(kind: str = "auto") -> DeviceInfo:
    if kind in ("auto", "cuda"):
        gpu = _nvml_device()
        if gpu:
            return gpu
    return DeviceInfo("cpu", cpu_name(), cpu_count())


def _nvml_device() -> DeviceInfo | None:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no driver, no library: a CPU machine
        return None
    try:
        n = pynvml.nvmlDeviceGetCount()
        if n == 0:
            return None
        name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0))
        return DeviceInfo("cuda", name.decode() if isinstance(name, bytes) else name, n)
    finally:
        pynvml.nvmlShutdown()


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "CPU"


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1
