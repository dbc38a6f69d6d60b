"""Built-in device-hour prices, each with its source and date. `cost.gpu_hour_usd` overrides.

Prices are typical on-demand list prices per device-hour (per GPU; for CPUs, per core-hour),
rounded. They are a default for a report, not a quote: set cost.gpu_hour_usd for your own rate.
"""

from __future__ import annotations

from dataclasses import dataclass

from jobrunner.telemetry.device import DeviceInfo


@dataclass(frozen=True)
class Price:
    usd_per_hour: float  # per device (GPU) or per CPU core
    source: str
    date: str


# Matched by substring of the device name, first match wins (so "H100" before "H10").
GPU_PRICES: list[tuple[str, Price]] = [
    ("H200", Price(3.50, "cloud on-demand list price per H200 GPU-hour (8-GPU instances / 8)", "2026-11")),
    ("H100", Price(2.99, "cloud on-demand list price per H100 SXM GPU-hour", "2026-11")),
    ("A100-SXM4-80GB", Price(1.79, "cloud on-demand list price per A100 80GB GPU-hour", "2026-11")),
    ("A100 80GB", Price(1.79, "cloud on-demand list price per A100 80GB GPU-hour", "2026-11")),
    ("A100", Price(1.29, "cloud on-demand list price per A100 40GB GPU-hour", "2026-11")),
    ("L40S", Price(1.05, "cloud on-demand list price per L40S GPU-hour", "2026-11")),
    ("A10G", Price(1.01, "AWS g5.xlarge on-demand (1x A10G)", "2026-11")),
    ("L4", Price(0.80, "GCP g2-standard-4 on-demand (1x L4)", "2026-11")),
    ("T4", Price(0.53, "AWS g4dn.xlarge on-demand (1x T4)", "2026-11")),
]
CPU_CORE_PRICE = Price(0.048, "AWS c7i on-demand price per vCPU-hour (c7i.large $0.0893 / 2)", "2026-11")
UNKNOWN_GPU_PRICE = Price(2.00, "no table entry for this GPU: a generic on-demand GPU-hour", "2026-11")


def device_price(device: DeviceInfo) -> Price:
    if device.kind == "cpu":
        return CPU_CORE_PRICE
    for key, price in GPU_PRICES:
        if key.lower() in device.name.lower():
            return price
    return UNKNOWN_GPU_PRICE


def hourly_rate(device: DeviceInfo, override: float | None) -> tuple[float, str]:
    """USD per hour for the whole job's devices, and where that number came from."""
    if override is not None:
        return override * device.count, "cost.gpu_hour_usd (job file)"
    p = device_price(device)
    return p.usd_per_hour * device.count, f"{p.source}, {p.date}"
