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
    (
        "H200",
        Price(
            3.50, "cloud on-demand list price per H200 GPU-hour (8-GPU instances / 8)", "2026-11"
        ),
    ),
    ("H100", Price(2.99, "cloud on-demand list price per H100 SXM GPU-hour", "2026-11")),
    ("A100-SXM4-80GB", Price(1.79, "cloud on-demand list price per A100 80GB GPU-hour", "2026-11")),
    ("A100 80GB", Price(1.79, "cloud on-demand list price per A100 80GB GPU-hour", "2026-11")),
    ("A100", Price(1.29, "cloud on-demand list price per A100 40GB GPU-hour", "2026-11")),
    ("L40S", Price(1.05, "cloud on-demand list price per L40S GPU-hour", "2026-11")),
    ("A10G", Price(1.01, "AWS g5.xlarge on-demand (1x A10G)", "2026-11")),
    ("L4", Price(0.80, "GCP g2-standard-4 on-demand (1x L4)", "2026-11")),
    ("T4", Price(0.53, "AWS g4dn.xlarge on-demand (1x T4)", "2026-11")),
]
CPU_CORE_PRICE = Price(
    0.048, "AWS c7i on-demand price per vCPU-hour (c7i.large $0.0893 / 2)", "2026-11"
)
UNKNOWN_GPU_PRICE = Price(
    2.00, "no table entry for this GPU: a generic on-demand GPU-hour", "2026-11"
)


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


# ---------------------------------------------------------------- API-equivalent prices


@dataclass(frozen=True)
class ApiPrice:
    """A hosted batch API's list price in USD per 1M tokens (input, output)."""

    provider: str
    model: str
    usd_per_1m_input: float
    usd_per_1m_output: float
    source: str
    date: str

    def price(self, prompt_tokens: int, completion_tokens: int) -> float:
        return (
            prompt_tokens * self.usd_per_1m_input + completion_tokens * self.usd_per_1m_output
        ) / 1e6


# Batch prices (50% of the interactive price) as published by each provider at `date`. Every
# prompt token is priced as input (no provider prompt-cache discount): a like-for-like bill for
# the same tokens. Prices change; the date says how old these are.
_OPENAI = ("OpenAI Batch API list price, openai.com/api/pricing", "2025-06")
_ANTHROPIC = ("Anthropic Message Batches list price, docs.anthropic.com pricing", "2025-06")
API_PRICES: list[ApiPrice] = [
    ApiPrice("OpenAI", "gpt-4.1-nano", 0.05, 0.20, *_OPENAI),
    ApiPrice("OpenAI", "gpt-4o-mini", 0.075, 0.30, *_OPENAI),
    ApiPrice("OpenAI", "gpt-4.1-mini", 0.20, 0.80, *_OPENAI),
    ApiPrice("OpenAI", "gpt-4o", 1.25, 5.00, *_OPENAI),
    ApiPrice("Anthropic", "claude-3-haiku", 0.125, 0.625, *_ANTHROPIC),
    ApiPrice("Anthropic", "claude-3.5-haiku", 0.40, 2.00, *_ANTHROPIC),
    ApiPrice("Anthropic", "claude-sonnet-4", 1.50, 7.50, *_ANTHROPIC),
]


def api_equivalent(
    prompt_tokens: int, completion_tokens: int, own_usd: float | None = None
) -> list[dict]:
    """What the same tokens would cost at each listed API, and how that compares to ours."""
    out = []
    for p in API_PRICES:
        usd = p.price(prompt_tokens, completion_tokens)
        out.append(
            {
                "provider": p.provider,
                "model": p.model,
                "usd": usd,
                "usd_per_1m_input": p.usd_per_1m_input,
                "usd_per_1m_output": p.usd_per_1m_output,
                "ratio_to_ours": usd / own_usd if own_usd else None,
                "source": p.source,
                "date": p.date,
            }
        )
    return out
