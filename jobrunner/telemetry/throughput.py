"""How long a job will take on this machine: a four-number step-time model. No torch.

An engine step costs a fixed part (reading the weights once, scheduling: `step_s`), a part per
prompt token it computes (`token_s`), a part per sequence it decodes (`decode_token_s`: one new
token each) and a part per token of context those sequences attend to (`context_token_s`:
reading the KV cache). A job's forward time is then
    decode_steps * step_s + computed_prompt_tokens * token_s
      + completion_tokens * decode_token_s + context_token_steps * context_token_s
where decode_steps follows continuous batching (total completion tokens over the sequences that
run together, and never fewer than the longest completion) and context_token_steps sums, over
rows, the context each decode step reads: c * (prompt + c / 2) for c completion tokens.

The numbers come either from a roofline default for the device class (peak FLOP/s and memory
bandwidth at assumed efficiencies: NOT a measurement, and said so in every output), or from a
non-negative least-squares fit to the steps measured on this device (the profile: `jobrunner
estimate --calibrate N`, whose batches make each term vary apart from the others, see
calibration.py, and every run since).
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
    ("H200", DeviceClass(989, 4.8)),
    ("H100", DeviceClass(989, 3.35)),
    ("A100", DeviceClass(312, 1.9)),
    ("L40S", DeviceClass(362, 0.86)),
    ("A10G", DeviceClass(70, 0.6)),
    ("L4", DeviceClass(121, 0.3)),
    ("T4", DeviceClass(65, 0.32)),
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
    token_s: float  # seconds per computed prompt token
    load_s: float  # model load and engine setup
    source: str  # where the numbers come from, in words
    decode_token_s: float | None = None  # seconds per decoding sequence per step (None: token_s)
    context_token_s: float = 0.0  # seconds per context token a decoding sequence attends to
    prefill_context_s: float = 0.0  # seconds per context token a prompt token attends to

    def forward_seconds(
        self,
        computed_prompt_tokens: int,
        completions: list[int],
        max_num_seqs: int,
        prompts: list[int] | None = None,
    ) -> float:
        """`completions[i]` new tokens after `prompts[i]` prompt tokens, for each unique row."""
        total = sum(completions)
        together = max(1, min(max_num_seqs, len(completions)))
        steps = max(total / together, max(completions, default=0))
        per_decode = self.token_s if self.decode_token_s is None else self.decode_token_s
        context = sum(c * (p + c / 2) for p, c in zip(prompts or [], completions, strict=False))
        return (
            steps * self.step_s
            + computed_prompt_tokens * self.token_s
            + total * per_decode
            + context * self.context_token_s
        )

    def step_seconds(
        self, prefill_tokens: int, decode_tokens: int, kv_tokens: int = 0, prefill_context: int = 0
    ) -> float:
        """One paged-engine step: `kv_tokens` is the KV cache in use while rows decode,
        `prefill_context` what its prompt tokens attend to (ScheduledBatch)."""
        per_decode = self.token_s if self.decode_token_s is None else self.decode_token_s
        return (
            self.step_s
            + prefill_tokens * self.token_s
            + decode_tokens * per_decode
            + kv_tokens * self.context_token_s
            + prefill_context * self.prefill_context_s
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def device_class(device: DeviceInfo) -> DeviceClass:
    if device.kind == "cpu":
        return CPU_CORE
    return next((c for k, c in GPU_CLASSES if k.lower() in device.name.lower()), UNKNOWN_GPU)


def roofline_model(
    device: DeviceInfo, num_params: int, bytes_per_param: int, kv_bytes_per_token: int = 0
) -> StepModel:
    """The default: spec-sheet peaks at assumed efficiencies (not measured on this machine)."""
    c, kind = device_class(device), device.kind
    n = device.count  # CPU: cores; GPU: tensor-parallel devices
    flops = c.tflops * 1e12 * n * MFU[kind]
    bw = c.tb_per_s * 1e12 * n * BW_EFF[kind]
    weights = num_params * bytes_per_param
    return StepModel(
        step_s=weights / bw + STEP_OVERHEAD_S[kind],
        token_s=2 * num_params / flops,
        load_s=weights / (LOAD_GB_PER_S * 1e9) + 2.0,
        context_token_s=kv_bytes_per_token / bw,
        source=(
            f"roofline default for {n} x {device.name} (not measured: assumed"
            f" {MFU[kind]:.0%} of {c.tflops:g} TFLOP/s and {BW_EFF[kind]:.0%} of"
            f" {c.tb_per_s:g} TB/s per {'core' if kind == 'cpu' else 'GPU'};"
            " use --calibrate N to measure)"
        ),
    )


def fit_step_model(
    steps: list[dict[str, Any]], load_s: float, rows: int, block_size: int = 16
) -> StepModel:
    """Non-negative least squares of step_seconds on (1, prefill tokens, decode tokens, decode
    context, prefill context), in relative error, steps slowed by other load left out.

    Decode context is the KV cache in use during a decode step (blocks x block_size), which is
    what the step's attention reads; prefill context is what its prompt tokens attend to.
    Relative error, so that the many short decode steps weigh as much as a few long prefill
    steps (in seconds those would set every term); then the steps over TRIM x the fit's time
    (another job took the cores for a while) are dropped and the fit is made again, until no
    more are dropped.
    """
    timed = [s for s in steps if s.get("batch_tokens") and s.get("step_seconds")]
    if not timed:
        raise ValueError("the calibration run logged no engine steps")
    split = all(s.get("prefill_tokens") is not None for s in timed)
    pts = [_regressors(s, block_size) if split else _batch_only(s) for s in timed]
    coef, kept = nnls(pts, relative=True), pts
    for _ in range(TRIM_ROUNDS):
        fewer = [p for p in pts if p[-1] <= TRIM * _predict(coef, p)]
        if len(fewer) == len(kept) or len(fewer) < len(coef):
            break
        coef, kept = nnls(fewer, relative=True), fewer
    a, b, c, d, e = coef
    return StepModel(
        step_s=a,
        token_s=b,
        load_s=load_s,
        decode_token_s=c if split else None,
        context_token_s=d,
        prefill_context_s=e,
        source=f"calibrated: {rows} sampled rows, {len(pts)} engine steps measured on this machine",
    )


TRIM = 2.0  # a step this many times slower than the fit says was slowed by something else
TRIM_ROUNDS = 4  # refits, each without the steps the last one found slowed


def _regressors(s: dict[str, Any], block_size: int) -> tuple[float, ...]:
    """The paged engine's step: (1, prefill, decode, decode context, prefill context, seconds)."""
    decode = float(s["decode_tokens"] or 0)
    return (
        1.0,
        float(s["prefill_tokens"]),
        decode,
        float((s.get("kv_blocks_used") or 0) * block_size) if decode else 0.0,
        float(s.get("prefill_context_tokens") or 0),
        float(s["step_seconds"]),
    )


def _batch_only(s: dict[str, Any]) -> tuple[float, ...]:
    """No prefill/decode split (the static engine): a step is a batch, tokens only."""
    return (1.0, float(s["batch_tokens"]), 0.0, 0.0, 0.0, float(s["step_seconds"]))


def _predict(coef: tuple[float, ...], p: tuple[float, ...]) -> float:
    return sum(k * x for k, x in zip(coef, p[:-1], strict=True))


def nnls(pts: list[tuple[float, ...]], relative: bool = False) -> tuple[float, ...]:
    """Best non-negative coefficients for y = sum(k_i * x_i) (each point: x..., y), trying
    every subset of terms (a handful of terms: 2^k small least-squares problems); `relative`:
    each point's error as a fraction of its y."""
    import itertools

    import numpy as np

    X = np.array([p[:-1] for p in pts])
    y = np.array([p[-1] for p in pts])
    if relative:
        w = 1.0 / np.maximum(y, 1e-9)
        X, y = X * w[:, None], y * w
    k = X.shape[1]
    best, best_err = (0.0,) * k, float(((y) ** 2).sum())
    for size in range(k, 0, -1):
        for cols in itertools.combinations(range(k), size):
            coef, *_ = np.linalg.lstsq(X[:, cols], y, rcond=None)
            if (coef < 0).any():
                continue
            full = np.zeros(k)
            full[list(cols)] = coef
            err = float(((X @ full - y) ** 2).sum())
            if err < best_err - 1e-15:
                best, best_err = tuple(float(v) for v in full), err
    return best
