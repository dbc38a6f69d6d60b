"""How long a job will take on this machine: a two-number step-time model. No torch.

An engine step costs a fixed part (reading the weights once, scheduling: `step_s`) plus a part
per token in the batch (the matmuls: `token_s`). A job's forward time is then
    decode_steps * step_s + (computed prompt tokens + completion tokens) * token_s
where decode_steps follows continuous batching: total completion tokens over the sequences that
run together, and never fewer than the longest completion.

The two numbers come either from a roofline default for the device class (peak FLOP/s and
memory bandwidth at assumed efficiencies: NOT a measurement, and said so in every output), or
from a least-squares fit to a calibration run's step log (`jobrunner estimate --calibrate N`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from jobrunner.telemetry.device import DeviceInfo


@dataclass(frozen=True)
class DeviceClass:
    tflops: float  # peak dense 16-bit TFLOP/s per GPU (CPU: fp32 per core)
    tb_per_s: float  # memory bandwidth per GPU (CPU: per core, shared)


# Public spec-sheet figures, matched by substring of the device name (first match wins).
GPU_CLASSES: list[tuple[str, DeviceClass]] = [
    ("H200", DeviceClass(989, 4.8)), ("H100", DeviceClass(989, 3.35)),
    ("A100", DeviceClass(312, 1.9)), ("L40S", DeviceClass(362, 0.86)),
    ("A10G", DeviceClass(70, 0.6)), ("L4", DeviceClass(121, 0.3)), ("T4", DeviceClass(65, 0.32)),
]
UNKNOWN_GPU = DeviceClass(100, 1.0)
CPU_CORE = DeviceClass(0.05, 0.01)  # ~50 GFLOP/s fp32 and ~10 GB/s per core
MFU = {"cuda": 0.35, "cpu": 0.25}  # fraction of peak FLOP/s reached by the engines
BW_EFF = {"cuda": 0.6, "cpu": 0.5}  # fraction of peak bandwidth when streaming the weights
STEP_OVERHEAD_S = {"cuda": 0.004, "cpu": 0.02}  # Python per step (schedule, sample, detok)
LOAD_GB_PER_S = 1.0  # weights read from a local disk or the page cache


@dataclass(frozen=True)
class StepModel:
    step_s: float  # fixed seconds per engine step
    token_s: float  # seconds per token in the batch
    load_s: float  # model load and engine setup
    source: str  # where the numbers come from, in words

    def forward_seconds(self, computed_prompt_tokens: int, completions: list[int],
                        max_num_seqs: int) -> float:
        total = sum(completions)
        together = max(1, min(max_num_seqs, len(completions)))
        steps = max(total / together, max(completions, default=0))
        return steps * self.step_s + (computed_prompt_tokens + total) * self.token_s

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def device_class(device: DeviceInfo) -> DeviceClass:
    if device.kind == "cpu":
        return CPU_CORE
    return next((c for k, c in GPU_CLASSES if k.lower() in device.name.lower()), UNKNOWN_GPU)


def roofline_model(device: DeviceInfo, num_params: int, bytes_per_param: int) -> StepModel:
    """The default: spec-sheet peaks at assumed efficiencies (not measured on this machine)."""
    c, kind = device_class(device), device.kind
    n = device.count  # CPU: cores; GPU: tensor-parallel devices
    flops = c.tflops * 1e12 * n * MFU[kind]
    bw = c.tb_per_s * 1e12 * n * BW_EFF[kind]
    weights = num_params * bytes_per_param
    return StepModel(step_s=weights / bw + STEP_OVERHEAD_S[kind], token_s=2 * num_params / flops,
                     load_s=weights / (LOAD_GB_PER_S * 1e9) + 2.0,
                     source=(f"roofline default for {n} x {device.name} (not measured: assumed"
                             f" {MFU[kind]:.0%} of {c.tflops:g} TFLOP/s and {BW_EFF[kind]:.0%} of"
                             f" {c.tb_per_s:g} TB/s per {'core' if kind == 'cpu' else 'GPU'};"
                             " use --calibrate N to measure)"))


def fit_step_model(steps: list[dict[str, Any]], load_s: float, rows: int) -> StepModel:
    """Least squares of step_seconds on batch tokens, both coefficients kept non-negative."""
    pts = [(float(s["batch_tokens"]), float(s["step_seconds"])) for s in steps
           if s.get("batch_tokens") and s.get("step_seconds") is not None]
    if not pts:
        raise ValueError("the calibration run logged no engine steps")
    n = len(pts)
    mx, my = sum(x for x, _ in pts) / n, sum(y for _, y in pts) / n
    var = sum((x - mx) ** 2 for x, _ in pts)
    slope = sum((x - mx) * (y - my) for x, y in pts) / var if var else 0.0
    slope = max(slope, 0.0)
    step_s = max(my - slope * mx, 0.0)
    if step_s == 0.0:  # no fixed part: refit through the origin
        slope = sum(x * y for x, y in pts) / sum(x * x for x, _ in pts)
    return StepModel(step_s=step_s, token_s=slope, load_s=load_s,
                     source=f"calibrated: {rows} sampled rows, {n} engine steps measured on this machine")
