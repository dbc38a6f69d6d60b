"""The built-in prices, each with the source it was read from and the date that source gives.

`date` is what the source itself says (a page's "updated" date, or the month its figures are
for); None when the source gives no date. An entry without a current source says so in its
`source` and has no date, so every report that uses it warns. Batch prices are the providers'
batch (asynchronous) rates: 50% of their standard rates, as each provider publishes. Refresh
these from the cited pages; `cost.gpu_hour_usd` or `cost.price_file` override them per job.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Price:
    """One device's on-demand price: USD per `unit` (a GPU-hour, or a vCPU-hour)."""

    usd_per_hour: float
    unit: str  # "GPU-hour" | "vCPU-hour"
    source: str
    date: str | None  # YYYY-MM or YYYY-MM-DD, as the source gives it


@dataclass(frozen=True)
class ApiPrice:
    """A hosted batch API's price in USD per 1M tokens."""

    provider: str
    model: str
    usd_per_1m_input: float
    usd_per_1m_output: float
    source: str
    date: str | None
    usd_per_1m_cached_input: float | None = None  # None: no dated source gave one

    def price(self, prompt_tokens: int, completion_tokens: int) -> float:
        return (
            prompt_tokens * self.usd_per_1m_input + completion_tokens * self.usd_per_1m_output
        ) / 1e6


_UNVERIFIED = "no current published source found; carried over from an earlier table, unverified"
_MERCATUS = (
    "https://www.mercatus-ai.com/blog/cloud-gpu-pricing (on-demand, specialty-cloud tier,"
    " middle of the range it gives)"
)

# Matched by substring of the GPU's name, first match wins (so "H100" before "H10").
GPU_PRICES: list[tuple[str, Price]] = [
    ("H200", Price(4.00, "GPU-hour", f"{_MERCATUS}: H200 SXM5 $3.50-$4.50", "2026-05")),
    ("H100", Price(3.00, "GPU-hour", f"{_MERCATUS}: H100 SXM5 $2.50-$3.50", "2026-05")),
    ("A100-SXM4-80GB", Price(1.30, "GPU-hour", f"{_MERCATUS}: A100 80GB $1.10-$1.50", "2026-05")),
    ("A100 80GB", Price(1.30, "GPU-hour", f"{_MERCATUS}: A100 80GB $1.10-$1.50", "2026-05")),
    ("A100", Price(1.29, "GPU-hour", f"A100 40GB: {_UNVERIFIED}", None)),
    ("L40S", Price(1.05, "GPU-hour", f"L40S: {_UNVERIFIED}", None)),
    (
        "A10G",
        Price(
            1.006,
            "GPU-hour",
            "https://www.factualminds.com/blog/amazon-ec2-on-demand-pricing-instance-families-2026/"
            " (AWS g5.xlarge, 1x A10G, us-east-1 on-demand)",
            "2026-06-17",
        ),
    ),
    ("L4", Price(0.80, "GPU-hour", f"L4: {_UNVERIFIED}", None)),
    ("T4", Price(0.53, "GPU-hour", f"T4: {_UNVERIFIED}", None)),
]
UNKNOWN_GPU_PRICE = Price(
    2.00, "GPU-hour", f"no entry for this GPU; a generic GPU-hour, {_UNVERIFIED}", None
)

_INFRACOST = "https://gist.github.com/alikhajeh1/6107727c5218382b9cc6af69be562111 (Infracost output"
_AWS_C5 = (
    "https://docs.aws.amazon.com/autoscaling/ec2/userguide/weights-spot-price-per-unit-hour-example.html"
    " (c5.2xlarge, 8 vCPUs, $0.34/h on-demand; AWS labels it example, not current, pricing)"
)

# CPU families, keyed by telemetry.device.cpu_family(): an AWS vCPU is one hardware thread, so
# a vCPU-hour prices one logical CPU of this machine for an hour.
CPU_PRICES: dict[str, Price] = {
    "AMD Zen 3": Price(
        0.0432,
        "vCPU-hour",
        f"{_INFRACOST}: AWS m6a.large, AMD EPYC Milan, 2 vCPUs, $63.07 per 730 h, us-east-1)",
        None,
    ),
    "AMD Zen 4": Price(0.0432, "vCPU-hour", f"AWS c7a/m7a (EPYC Genoa): {_UNVERIFIED}", None),
    "AMD Zen 2": Price(0.0432, "vCPU-hour", f"AWS c5a (EPYC Rome): {_UNVERIFIED}", None),
    "Intel Ice Lake": Price(
        0.0425,
        "vCPU-hour",
        f"{_INFRACOST}: AWS c6i.large, Intel Xeon Ice Lake, 2 vCPUs, $62.05 per 730 h, us-east-1)",
        None,
    ),
    "Intel Sapphire Rapids": Price(
        0.0447, "vCPU-hour", f"AWS c7i.large $0.0893 / 2 vCPUs: {_UNVERIFIED}", None
    ),
    "Intel Skylake/Cascade Lake": Price(0.0425, "vCPU-hour", _AWS_C5, None),
}
UNKNOWN_CPU_PRICE = Price(
    0.0430,
    "vCPU-hour",
    f"no entry for this CPU family; a generic x86 vCPU-hour, {_UNVERIFIED}",
    None,
)

_OPENAI = (
    "https://deploybase.ai/articles/openai-pricing (from OpenAI's pricing page; batch = 50% of"
    " standard, per OpenAI)"
)
_OPENAI_41 = "https://deploybase.ai/articles/gpt-4.1-pricing (batch column, from OpenAI's pricing)"
_ANTHROPIC_OLD = (
    "https://docs.anthropic.com/en/docs/build-with-claude/batch-processing (batch table; the page"
    " gives no date, it lists models up to claude-opus-4-1-20250805)"
)
_ANTHROPIC = (
    "https://ai-tools-compared.pages.dev/claude-api-batch-processing-discount-how-much-cheaper-than-r"
    " (batch column; agrees with dev.to/neverpaytwice's copy of Anthropic's batch page)"
)
_GOOGLE = (
    "https://deploybase.ai/articles/gemini-2.5-pricing (standard) x 50%: batch mode per"
    " https://developers.googleblog.com/scale-your-ai-workloads-batch-mode-gemini-api (2025-07-07)"
)
_GOOGLE_LITE = (
    "https://aifreeapi.com/en/posts/gemini-api-pricing-2026 (standard) x 50%: batch mode per"
    " https://developers.googleblog.com/scale-your-ai-workloads-batch-mode-gemini-api (2025-07-07)"
)

# What the same tokens would cost at a hosted batch API. Every prompt token is priced as input:
# our prefix-cache hits are free here, a provider's cache discount depends on its own cache.
API_PRICES: list[ApiPrice] = [
    ApiPrice("OpenAI", "gpt-5-nano", 0.025, 0.20, _OPENAI, "2026-03"),
    ApiPrice("OpenAI", "gpt-4.1-nano", 0.05, 0.20, _OPENAI_41, "2026-03"),
    ApiPrice("OpenAI", "gpt-4o-mini", 0.075, 0.30, _OPENAI, "2026-03"),
    ApiPrice("OpenAI", "gpt-5-mini", 0.125, 1.00, _OPENAI, "2026-03"),
    ApiPrice("OpenAI", "gpt-4.1-mini", 0.20, 0.80, _OPENAI_41, "2026-03"),
    ApiPrice("Anthropic", "claude-3-haiku", 0.125, 0.625, _ANTHROPIC_OLD, None),
    ApiPrice("Anthropic", "claude-3.5-haiku", 0.40, 2.00, _ANTHROPIC_OLD, None),
    ApiPrice("Anthropic", "claude-haiku-4.5", 0.50, 2.50, _ANTHROPIC, "2026-03-16"),
    ApiPrice("Anthropic", "claude-sonnet-4.6", 1.50, 7.50, _ANTHROPIC, "2026-03-16"),
    ApiPrice("Google", "gemini-2.5-flash-lite", 0.05, 0.20, _GOOGLE_LITE, "2026-01"),
    ApiPrice("Google", "gemini-2.5-flash", 0.15, 1.25, _GOOGLE, "2026-03"),
]
