"""The price a job is billed at, where it came from, and whether it is too old to trust.

The built-in tables (telemetry.price_table) are looked up by the detected device: a GPU by its
name, a CPU by its family (an Intel price is never applied to an AMD CPU). `cost.gpu_hour_usd`
overrides the device price; `cost.price_file` (JSON or YAML) overrides either table:
    device: {usd_per_hour: 0.05, unit: vCPU-hour, source: "our contract", date: 2026-11}
    apis: [{provider: X, model: m, usd_per_1m_input: 0.1, usd_per_1m_output: 0.4,
            usd_per_1m_cached_input: 0.01, source: "...", date: 2026-10}]
A price older than STALE_MONTHS (or undated) comes with a warning in the report and estimate.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from jobrunner.telemetry.device import DeviceInfo
from jobrunner.telemetry.price_table import (
    API_PRICES,
    CPU_PRICES,
    GPU_PRICES,
    UNKNOWN_CPU_PRICE,
    UNKNOWN_GPU_PRICE,
    ApiPrice,
    Price,
)

STALE_MONTHS = 6


@dataclass(frozen=True)
class Rate:
    """What the job's devices cost per hour, all of them together."""

    usd_per_hour: float
    price: Price  # per unit
    units: int  # GPUs, or logical CPUs (vCPUs)

    @property
    def label(self) -> str:
        """e.g. "$0.0432 per vCPU-hour x 2 vCPUs (source, date)"."""
        unit = self.price.unit.removesuffix("-hour")
        when = self.price.date or "undated"
        return (
            f"${self.price.usd_per_hour:.4g} per {self.price.unit} x {self.units} {unit}s"
            f" ({self.price.source}; {when})"
        )


def device_price(device: DeviceInfo) -> Price:
    if device.kind == "cpu":
        return CPU_PRICES.get(device.family, UNKNOWN_CPU_PRICE)
    for key, price in GPU_PRICES:
        if key.lower() in device.name.lower():
            return price
    return UNKNOWN_GPU_PRICE


def device_rate(device: DeviceInfo, cost=None) -> Rate:
    """The job's hourly rate: cost.gpu_hour_usd, else cost.price_file, else the table."""
    price = device_price(device)
    unit = price.unit
    if cost is not None and cost.price_file:
        dev = load_price_file(cost.price_file).get("device")
        if dev:
            price = Price(
                float(dev["usd_per_hour"]),
                str(dev.get("unit", unit)),
                str(dev.get("source", cost.price_file)),
                _date(dev.get("date")),
            )
    if cost is not None and cost.gpu_hour_usd is not None:
        price = Price(cost.gpu_hour_usd, unit, "cost.gpu_hour_usd (job file)", _today())
    return Rate(price.usd_per_hour * device.count, price, device.count)


def api_prices(cost=None) -> list[ApiPrice]:
    if cost is not None and cost.price_file:
        apis = load_price_file(cost.price_file).get("apis")
        if apis:
            return [
                ApiPrice(
                    str(a["provider"]),
                    str(a["model"]),
                    float(a["usd_per_1m_input"]),
                    float(a["usd_per_1m_output"]),
                    str(a.get("source", cost.price_file)),
                    _date(a.get("date")),
                    a.get("usd_per_1m_cached_input"),
                )
                for a in apis
            ]
    return API_PRICES


def api_equivalent(
    prompt_tokens: int,
    completion_tokens: int,
    own_usd: float | None = None,
    prices: list[ApiPrice] | None = None,
) -> list[dict]:
    """What the same tokens would cost at each listed API, and how that compares to ours."""
    out = []
    for p in prices or API_PRICES:
        usd = p.price(prompt_tokens, completion_tokens)
        out.append(
            {
                "provider": p.provider,
                "model": p.model,
                "usd": usd,
                "usd_per_1m_input": p.usd_per_1m_input,
                "usd_per_1m_output": p.usd_per_1m_output,
                "usd_per_1m_cached_input": p.usd_per_1m_cached_input,
                "ratio_to_ours": usd / own_usd if own_usd else None,
                "source": p.source,
                "date": p.date,
            }
        )
    return out


def run_price_fields(rate: Rate, cost=None) -> dict[str, Any]:
    """The price fields a run record keeps, so the report (rebuilt from the run directory alone)
    names the unit and date billed, and the hosted-API prices a price file set."""
    out: dict[str, Any] = {"price_unit": rate.price.unit, "price_date": rate.price.date}
    if cost is not None and cost.price_file and load_price_file(cost.price_file).get("apis"):
        out["api_prices"] = [asdict(p) for p in api_prices(cost)]
    return out


def api_prices_of_run(run: dict[str, Any]) -> list[ApiPrice]:
    return [ApiPrice(**p) for p in run["api_prices"]] if run.get("api_prices") else API_PRICES


def price_warnings(
    rate_date: str | None, apis: list[dict], today: dt.date | None = None
) -> list[str]:
    """A line for the device price if it is undated or older than STALE_MONTHS, and one for the
    hosted-API prices that are."""
    today = today or dt.date.today()
    out = []
    age = months_old(rate_date, today)
    if age is None:
        out.append(
            "the device price has no dated source; set cost.gpu_hour_usd or cost.price_file"
            " to the price you pay"
        )
    elif age > STALE_MONTHS:
        out.append(
            f"the device price is from {rate_date}, {age:.0f} months old (over {STALE_MONTHS});"
            " set cost.gpu_hour_usd or cost.price_file to a current one"
        )
    old = [a for a in apis if (m := months_old(a["date"], today)) is None or m > STALE_MONTHS]
    if old:
        dated = sorted(a["date"] for a in old if a["date"])
        oldest = f", the oldest from {dated[0]}" if dated else ""
        out.append(
            f"{len(old)} of {len(apis)} hosted-API prices are undated or over {STALE_MONTHS}"
            f" months old{oldest}; cost.price_file can give current ones"
        )
    return out


def months_old(date: str | None, today: dt.date) -> float | None:
    if not date:
        return None
    parts = [int(p) for p in str(date).split("-")]
    d = dt.date(parts[0], parts[1] if len(parts) > 1 else 1, parts[2] if len(parts) > 2 else 1)
    return (today - d).days / 30.44


@lru_cache(maxsize=8)
def load_price_file(path: str) -> dict[str, Any]:
    text = Path(path).read_text(encoding="utf-8")
    if path.endswith((".yaml", ".yml")):
        import yaml

        return yaml.safe_load(text) or {}
    return json.loads(text)


def _date(v: Any) -> str | None:
    return None if v is None else str(v)


def _today() -> str:
    return dt.date.today().isoformat()
