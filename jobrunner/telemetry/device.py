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
    count: int  # GPUs, or logical CPUs (vCPUs) available to this process
    family: str = ""  # CPUs: the microarchitecture, e.g. "AMD Zen 3" (see cpu_family)

    def __str__(self) -> str:
        unit = "GPU" if self.kind == "cuda" else "vCPU"
        return f"{self.count} x {self.name} ({unit}{'s' if self.count != 1 else ''})"


@lru_cache(maxsize=1)
def detect_device(kind: str = "auto") -> DeviceInfo:
    if kind in ("auto", "cuda"):
        gpu = _nvml_device()
        if gpu:
            return gpu
    return DeviceInfo("cpu", cpu_name(), cpu_count(), cpu_family())


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


# (vendor, cpu family) -> [(first model, last model, microarchitecture)] for server parts
_FAMILIES = {
    ("AuthenticAMD", 23): [(0x00, 0x2F, "AMD Zen 2"), (0x30, 0x3F, "AMD Zen 2")],
    ("AuthenticAMD", 25): [
        (0x00, 0x0F, "AMD Zen 3"),
        (0x10, 0x1F, "AMD Zen 4"),
        (0xA0, 0xAF, "AMD Zen 4"),
    ],
    ("AuthenticAMD", 26): [(0x00, 0xFF, "AMD Zen 5")],
    ("GenuineIntel", 6): [
        (0x55, 0x55, "Intel Skylake/Cascade Lake"),
        (0x6A, 0x6C, "Intel Ice Lake"),
        (0x8F, 0x8F, "Intel Sapphire Rapids"),
        (0xCF, 0xCF, "Intel Emerald Rapids"),
        (0xAD, 0xAE, "Intel Granite Rapids"),
    ],
}


def cpu_family(cpuinfo: str | None = None) -> str:
    """The CPU's microarchitecture from /proc/cpuinfo's vendor, family and model numbers (a
    cloud VM's model name is often just "AMD EPYC"); "" when unknown."""
    try:
        text = cpuinfo if cpuinfo is not None else Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            break  # the first processor is enough
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    try:
        vendor, family, model = fields["vendor_id"], int(fields["cpu family"]), int(fields["model"])
    except (KeyError, ValueError):
        return ""
    for lo, hi, name in _FAMILIES.get((vendor, family), []):
        if lo <= model <= hi:
            return name
    return ""


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1
