"""A background sampler: device and host readings every `interval` seconds, kept in memory.

Per GPU (through NVML): utilisation, memory used, power, temperature, SM clock and the energy
counter. For the host (through psutil): CPU utilisation and this process's RSS, so CPU runs get a
timeline too. Any reading a driver does not offer is left out (None), never guessed.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

log = logging.getLogger(__name__)

DEFAULT_INTERVAL = 1.0


class Sampler:
    """`start()` ... `stop()`; `samples` holds one dict per device (and one for the host) per tick."""

    def __init__(self, interval: float = DEFAULT_INTERVAL) -> None:
        self.interval = interval
        self.samples: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._gpus = _open_nvml()
        self._proc = _open_process()
        self.t0 = time.time()

    def start(self) -> Sampler:
        self.t0 = time.time()
        self.sample()
        self._thread = threading.Thread(target=self._loop, name="jobrunner-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> list[dict[str, Any]]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
            self.sample()  # the closing reading, so energy covers the whole run
        if self._gpus:
            _close_nvml()
            self._gpus = []
        return self.samples

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.sample()
            except Exception as e:  # a telemetry failure never stops a job
                log.debug("sampler: %s", e)

    def sample(self) -> None:
        now = time.time()
        for i, handle in enumerate(self._gpus):
            self.samples.append(
                {"t": now, "elapsed_s": now - self.t0, "device": f"cuda:{i}", **gpu_reading(handle)}
            )
        if self._proc is not None:
            self.samples.append(
                {"t": now, "elapsed_s": now - self.t0, "device": "host", **host_reading(self._proc)}
            )

    def energy_kwh(self) -> float | None:
        """Energy used by the GPUs between the first and last reading (NVML counter), or None."""
        return energy_kwh(self.samples)


def energy_kwh(samples: list[dict[str, Any]]) -> float | None:
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    for s in samples:
        mj = s.get("energy_mj")
        if mj is None:
            continue
        first.setdefault(s["device"], mj)
        last[s["device"]] = mj
    if not first:
        return None
    return sum(last[d] - first[d] for d in first) / 3.6e9  # mJ -> kWh


# ---------------------------------------------------------------- readings


def _open_nvml() -> list[Any]:
    try:
        import pynvml

        pynvml.nvmlInit()
        return [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    except Exception:  # no driver or no library: a CPU machine
        return []


def _close_nvml() -> None:
    try:
        import pynvml

        pynvml.nvmlShutdown()
    except Exception:
        pass


def _read(fn, *args) -> Any:
    try:
        return fn(*args)
    except Exception:  # not supported on this device or driver
        return None


def gpu_reading(handle: Any) -> dict[str, Any]:
    import pynvml as n

    util = _read(n.nvmlDeviceGetUtilizationRates, handle)
    mem = _read(n.nvmlDeviceGetMemoryInfo, handle)
    power = _read(n.nvmlDeviceGetPowerUsage, handle)
    return {
        "util_percent": util.gpu if util else None,
        "mem_used_bytes": mem.used if mem else None,
        "mem_total_bytes": mem.total if mem else None,
        "power_w": power / 1000.0 if power is not None else None,
        "temperature_c": _read(n.nvmlDeviceGetTemperature, handle, n.NVML_TEMPERATURE_GPU),
        "sm_clock_mhz": _read(n.nvmlDeviceGetClockInfo, handle, n.NVML_CLOCK_SM),
        "energy_mj": _read(n.nvmlDeviceGetTotalEnergyConsumption, handle),
    }


def _open_process() -> Any:
    try:
        import psutil

        proc = psutil.Process()
        psutil.cpu_percent(None)  # the first call only sets the baseline
        return proc
    except Exception:
        return None


def host_reading(proc: Any) -> dict[str, Any]:
    import psutil

    return {
        "util_percent": psutil.cpu_percent(None),
        "mem_used_bytes": proc.memory_info().rss,
        "mem_total_bytes": psutil.virtual_memory().total,
        "power_w": None,
        "temperature_c": None,
        "sm_clock_mhz": None,
        "energy_mj": None,
    }
