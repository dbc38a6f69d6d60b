"""What a calibration's plan does to the estimate, without the machine's load: steps timed by a
known step model (within +-noise), fitted as the profile is, and the fit's prediction for a job
of longer prompts against the known model's.

Plans, each on the same sampled rows (short prompts, as a quickstart's):
  two batches  the calibration before: random rows, a third of them then the rest
  by length    jobrunner.calibration: the shortest quarter, the longest quarter with a
               1,024-token row of the sample's tokens, all

    python scripts/bench_calibration_plan.py
    python scripts/bench_calibration_plan.py --seeds 20 --noise 0.1
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys

from jobrunner.calibration import calibration_groups
from jobrunner.telemetry.simulate import replay, step_log
from jobrunner.telemetry.throughput import StepModel, fit_step_model
from jobrunner.types import Request, SamplingParams

# Illustrative, of the order of this machine's when quiet (decode steps of 1 and 32 rows in about
# 30 and 75 ms), with prefill attention and KV reads that matter at a few hundred tokens.
DEVICE = StepModel(
    step_s=0.03,
    token_s=0.002,
    load_s=0.0,
    source="known",
    decode_token_s=0.0015,
    context_token_s=2e-6,
    prefill_context_s=4e-6,
)


def sample(rng: random.Random, rows: int) -> list[Request]:
    lengths = [rng.randint(15, 150) for _ in range(rows)]
    return [
        Request(f"r{i}", [1000 + 7 * i + j for j in range(n)], SamplingParams(max_new_tokens=64))
        for i, n in enumerate(lengths)
    ]


def measured(groups: list[list[Request]], rng: random.Random, noise: float) -> list[dict]:
    rows = [[(r.num_prompt_tokens,) * 2 + (r.sampling.max_new_tokens,) for r in g] for g in groups]
    steps = [s for g in rows for s in step_log(g, DEVICE, 256, 8192)]
    return [
        {**s, "step_seconds": s["step_seconds"] * rng.uniform(1 - noise, 1 + noise)} for s in steps
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--rows", type=int, default=8, help="rows the calibration samples")
    ap.add_argument("--noise", type=float, default=0.05, help="each step's time within +-this")
    args = ap.parse_args()
    errors: dict[str, list[float]] = {"two batches": [], "by length": []}
    for seed in range(args.seeds):
        rng = random.Random(seed)
        rows = sample(rng, args.rows)
        job = [(n, n, 32) for n in (rng.randint(100, 400) for _ in range(16))]
        want = replay(job, DEVICE, 256, 8192).forward_seconds
        cut = max(1, len(rows) // 3)
        plans = {
            "two batches": [rows[:cut], rows[cut:]],
            "by length": calibration_groups(rows, 4096),
        }
        for name, groups in plans.items():
            fit = fit_step_model(measured(groups, random.Random(seed), args.noise), 0.0, len(rows))
            errors[name].append(replay(job, fit, 256, 8192).forward_seconds / want - 1)
    print(f"16 rows of 100-400 prompt tokens, 32 new; calibrated on {args.rows} rows of 15-150")
    for name, e in errors.items():
        worst = max(e, key=abs)
        print(
            f"{name:<12} median |error| {statistics.median(map(abs, e)):6.1%}  worst {worst:+7.1%}"
            f"  each: {' '.join(f'{x:+.0%}' for x in e)}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
