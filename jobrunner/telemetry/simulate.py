"""Replay a job through the paged scheduler's rules to predict its steps and their time. No torch.

Each simulated step does what sched.Scheduler does: the running rows take their next tokens in
admission order (a decode token each, or the next chunk of their prompt) under the token budget,
then waiting rows are admitted while the budget and max_num_seqs allow. The step's time comes
from a StepModel (fixed + per prompt token + per decode token + per token of KV in use + per
token a prompt token attends to). Jobs
too long to replay whole are replayed for their first rows and scaled by rows.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

from jobrunner.telemetry.throughput import StepModel

MAX_ROW_STEPS = 400_000  # decode tokens replayed before scaling (a second or two of Python)


@dataclass
class Replay:
    steps: int
    forward_seconds: float
    rows: int  # rows replayed (the rest scaled)


@dataclass
class _Row:
    todo: int  # tokens to compute before this row next samples
    kv: int  # tokens in its KV cache
    left: int  # completion tokens still to produce
    decoding: bool = False


def replay(
    rows: list[tuple[int, int, int]],
    model: StepModel,
    max_num_seqs: int,
    max_batch_tokens: int,
    block_size: int = 16,
) -> Replay:
    """`rows`: (prompt tokens, prompt tokens to compute, completion tokens) per unique row."""
    todo = [r for r in rows if r[2] > 0]
    budget_rows, acc = [], 0
    for r in todo:
        if acc > MAX_ROW_STEPS:
            break
        budget_rows.append(r)
        acc += r[2]
    steps, seconds = _run(budget_rows, model, max_num_seqs, max_batch_tokens, block_size)
    scale = len(todo) / len(budget_rows) if budget_rows else 0.0
    return Replay(round(steps * scale), seconds * scale, len(budget_rows))


def _run(rows, model: StepModel, max_num_seqs: int, budget_tokens: int, block_size: int):
    steps, seconds = 0, 0.0
    for step in scheduled_steps(rows, max_num_seqs, budget_tokens, block_size):
        seconds += model.step_seconds(*step)
        steps += 1
    return steps, seconds


def scheduled_steps(
    rows: list[tuple[int, int, int]], max_num_seqs: int, budget_tokens: int, block_size: int = 16
) -> Iterator[tuple[int, int, int, int]]:
    """The steps the scheduler runs for `rows` (as replay takes them), each as StepModel.
    step_seconds's arguments: (prefill tokens, decode tokens, KV tokens in use while rows
    decode, context tokens the prompt tokens attend to)."""
    waiting = deque(rows)
    running: list[_Row] = []
    while waiting or running:
        budget, prefill, decode, batch = budget_tokens, 0, 0, []
        for r in running:
            if budget <= 0 or len(batch) >= max_num_seqs:
                break
            n = min(r.todo, budget)
            batch.append((r, n))
            budget -= n
        while waiting and budget > 0 and len(batch) < max_num_seqs:
            prompt, computed, completion = waiting.popleft()
            r = _Row(todo=max(computed, 1), kv=prompt - max(computed, 1), left=completion)
            running.append(r)
            n = min(r.todo, budget)
            batch.append((r, n))
            budget -= n
        attended = 0  # what the prompt tokens attend to (ScheduledBatch.num_prefill_context_tokens)
        for r, n in batch:
            if r.decoding:
                decode += n
            else:
                prefill += n
                attended += n * r.kv + n * (n + 1) // 2
        kv = sum(-(-(r.kv + n) // block_size) for r, n in batch) * block_size if decode else 0
        yield prefill, decode, kv, attended
        for r, n in batch:
            r.kv += n
            r.todo -= n
            if r.todo == 0:
                r.left -= 1
                r.todo, r.decoding = 1, True
        running = [r for r in running if r.left > 0]


def step_log(
    rows: list[tuple[int, int, int]],
    model: StepModel,
    max_num_seqs: int,
    max_batch_tokens: int,
    block_size: int = 16,
) -> list[dict]:
    """The steps `rows` make, as the paged engine logs them, each taking `model`'s time: what
    a device whose steps cost exactly that would measure (a fit on it should recover `model`)."""
    log = []
    for p, d, kv, pc in scheduled_steps(rows, max_num_seqs, max_batch_tokens, block_size):
        log.append(
            {
                "prefill_tokens": p,
                "decode_tokens": d,
                "prefill_context_tokens": pc,
                "kv_blocks_used": kv // block_size,
                "batch_tokens": p + d,
                "step_seconds": model.step_seconds(p, d, kv, pc),
            }
        )
    return log
