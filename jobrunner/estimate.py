"""`jobrunner estimate`: rows, tokens, time and cost of a job before it runs.

Reads and tokenizes every prompt (no weights are loaded), simulates the prefix cache and the
deduplication the run will do, and replays the rows through the paged scheduler's rules
(telemetry.simulate) with a step-time model: the one fitted on this device's profile (the steps
that `--calibrate N` and every earlier run measured here, telemetry.profile), else a roofline
guess, labelled as such. Completion lengths are exact for rows that ignore EOS, and for the rest
the share of max_new_tokens this model used in the profile (or in the calibration sample), else
the upper bound. The estimate is saved as <output.path>/estimate.json when output.path is new or
a run of this job (`save_estimate`); the report compares it.
"""

from __future__ import annotations

import bisect
import json
import random
import struct
import time
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobrunner.calibration import POOL_PER_ROW, calibrate_run, spread_by_length
from jobrunner.config import JobConfig
from jobrunner.engine.loader import load_tokenizer, local_dir_or_gguf, model_files, pick_dtype
from jobrunner.engine.samples import num_runs
from jobrunner.formats import job_rows, make_preparer
from jobrunner.io.rundir import make_run_dir
from jobrunner.io.writers import write_text_atomic
from jobrunner.prep.stream import dedup_key
from jobrunner.sched.block_manager import CHILDREN_KEPT, min_partial
from jobrunner.telemetry.device import detect_device
from jobrunner.telemetry.prices import api_equivalent, api_prices, device_rate, price_warnings
from jobrunner.telemetry.profile import DeviceProfile, load_profile, profile_key
from jobrunner.telemetry.simulate import replay
from jobrunner.telemetry.throughput import StepModel, fit_step_model, roofline_model

ESTIMATE_FILE = "estimate.json"
OTHER_S_PER_ROW = 0.0005  # reading, committing and writing a row outside the engine


@dataclass
class Scan:
    """What reading and tokenizing the input found (one pass, streamed)."""

    rows: int = 0
    invalid: int = 0
    prompt_tokens: int = 0
    bounds: list[int] = field(default_factory=list)  # per valid row: max completion tokens
    unique_bounds: list[int] = field(default_factory=list)  # the same, duplicates once
    unique_prompts: list[int] = field(default_factory=list)  # prompt tokens, duplicates once
    computed_prompt_tokens: int = 0  # unique rows, less the prefix-cache hits
    unique_rows: list[tuple[int, int, int, bool, int]] = field(default_factory=list)  # (prompt,
    # computed, max completion, can stop early, choices it returns) per computation of a unique
    # row, in input order: a row with n samples is n computations (a greedy one is one, n choices)
    deduplicated: int = 0
    sample: list[Any] = field(default_factory=list)  # reservoir of requests for calibration
    longest: Any = None  # the request of the most prompt tokens (calibration spans lengths)


def scan_input(cfg: JobConfig, tokenizer: Any, sample_size: int = 0, seed: int = 0) -> Scan:

    s, rng, seen_keys, seen_blocks = Scan(), random.Random(seed), set(), SeenBlocks()
    preparer = make_preparer(cfg, tokenizer)
    for item in preparer.prepare(job_rows(cfg.input)):
        s.rows += 1
        if not hasattr(item, "prompt_token_ids"):
            s.invalid += 1
            continue
        n = item.num_prompt_tokens
        bound = _bound(item, cfg, tokenizer)
        runs = num_runs(item)
        s.prompt_tokens += n
        s.bounds.append(bound * item.sampling.n)
        key = dedup_key(item)
        if key is not None and key in seen_keys:
            s.deduplicated += 1
            continue
        if key is not None:
            seen_keys.add(key)
        s.unique_bounds.append(bound)
        s.unique_prompts.append(n)
        for _ in range(runs):  # sample k > 0 finds the prompt's full blocks cached (samples.py)
            computed = n - _cached(item.prompt_token_ids, cfg, seen_blocks)
            s.computed_prompt_tokens += computed
            s.unique_rows.append((n, computed, bound, _can_stop(item), item.sampling.n // runs))
        _reservoir(s.sample, item, len(s.unique_bounds), sample_size * POOL_PER_ROW, rng)
        if sample_size and (s.longest is None or n > s.longest.num_prompt_tokens):
            s.longest = item
    return s


def _bound(item: Any, cfg: JobConfig, tokenizer: Any) -> int:
    """Most completion tokens one sample of this row can produce: max_new_tokens within the
    context, and for a `choice` grammar the longest label (and its end token)."""
    room = cfg.model.max_model_len - item.num_prompt_tokens
    bound = max(0, min(item.sampling.max_new_tokens, room))
    if _is_choice(item):
        labels = json.loads(item.sampling.structured.source)
        longest = max(len(tokenizer.encode(t, add_special_tokens=False)) for t in labels)
        bound = min(bound, longest + 1)
    return bound


def _can_stop(item: Any) -> bool:
    """Whether the row may end before its bound (a label's length is its bound already)."""
    return not item.sampling.ignore_eos and not _is_choice(item)


def _is_choice(item: Any) -> bool:
    spec = item.sampling.structured
    return spec is not None and spec.kind == "choice"


@dataclass
class SeenBlocks:
    """The full blocks of the prompts scanned so far, as a never-evicting prefix cache names
    them, and blocks that follow a head, 4 bytes a token, for partial hits (the block
    manager's rules, sched/block_manager.py), over prompts only (a run also names blocks its
    rows' outputs fill). Only a row's first block past its hits joins its head's children (the
    newest CHILDREN_KEPT a head), so memory grows by at most one block a row; the first row to
    stop after a head finds none there, where a run may serve it part of a block an earlier
    row made. And rows a run admits in one step find no part of a block another of them makes
    in it (they share its full blocks only): here they do."""

    hashes: set[int] = field(default_factory=set)
    # a head -> its children, newest last, and the same sorted: the child sharing the most
    # bytes (so tokens) with a row is a neighbour of where the row's bytes go in that order
    children: dict[int | None, tuple[list[bytes], list[bytes]]] = field(default_factory=dict)

    def served(self, ids: list[int], bs: int) -> int:
        """Prompt tokens of `ids` the cache would serve; then its blocks join the cache."""
        raw, parent, hits = array("I", ids).tobytes(), None, 0
        while hits + bs <= len(ids) - 1:  # the last token is always computed
            h = hash((parent, raw[4 * hits : 4 * (hits + bs)]))
            if h not in self.hashes:
                break
            parent, hits = h, hits + bs
        room = min(bs - 1, len(ids) - 1 - hits)
        want = raw[4 * hits : 4 * (hits + room)]
        partial = self._partial(parent, want)
        partial = partial if partial >= min_partial(bs) else 0
        self._add(raw, range(hits // bs, len(ids) // bs), bs, parent)
        return hits + partial

    def _add(self, raw: bytes, blocks: range, bs: int, parent: int | None) -> None:
        """The row's full blocks past its hits (`blocks`, after the head `parent`); the first
        of them joins that head's children."""
        for i in blocks:
            block = raw[4 * bs * i : 4 * bs * (i + 1)]
            if i == blocks.start:
                self._child(parent, block)
            parent = hash((parent, block))
            self.hashes.add(parent)

    def _child(self, parent: int | None, block: bytes) -> None:
        newest, ordered = self.children.setdefault(parent, ([], []))
        at = bisect.bisect_left(ordered, block)
        if at < len(ordered) and ordered[at] == block:
            return
        ordered.insert(at, block)
        newest.append(block)
        if len(newest) > CHILDREN_KEPT:
            ordered.remove(newest.pop(0))

    def _partial(self, parent: int | None, want: bytes) -> int:
        """The most tokens at the head of `want` that a child of `parent` begins with."""
        _, ordered = self.children.get(parent, ((), []))
        at = bisect.bisect_left(ordered, want)
        return max((_common(c, want) for c in ordered[max(0, at - 1) : at + 1]), default=0)


def _common(block: bytes, want: bytes) -> int:
    """Tokens at the head of `want` that `block` begins with (binary search, C compares)."""
    lo, hi = 0, len(want) // 4
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if block[: 4 * mid] == want[: 4 * mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _cached(ids: list[int], cfg: JobConfig, seen: SeenBlocks) -> int:
    """Prompt tokens a never-evicting prefix cache holding `seen` would serve, by the block
    manager's rules (as near as SeenBlocks follows them): the full blocks of a cached head, then
    the part of the next block that a cached block after the same head begins with; this
    prompt's blocks are added to `seen`.

    Rows admitted together share full blocks too: a row takes the blocks an earlier row
    computes whole in the same step (sched/step_blocks.py).
    """
    if not cfg.engine.prefix_caching:
        return 0
    return seen.served(ids, cfg.engine.block_size)


def _reservoir(sample: list, item: Any, n_seen: int, size: int, rng: random.Random) -> None:
    if len(sample) < size:
        sample.append(item)
    elif size:
        j = rng.randrange(n_seen)
        if j < size:
            sample[j] = item


# ---------------------------------------------------------------- the estimate


def estimate_job(cfg: JobConfig, calibrate: int = 0) -> dict[str, Any]:

    scan = scan_input(cfg, load_tokenizer(cfg.model), sample_size=calibrate)
    device = detect_device()
    rate = device_rate(device, cfg.cost)
    key = profile_key(cfg, device, compute_dtype(cfg))
    share, how = (
        None,
        "upper bound: every row generates max_new_tokens (use --calibrate N to measure)",
    )
    if calibrate:
        sample = spread_by_length([*scan.sample, *filter(None, [scan.longest])], calibrate)
        share = calibrate_run(cfg, sample, key)
        how = f"measured: {share:.0%} of max_new_tokens over {len(sample)} sampled rows"
    profile = load_profile(key)
    if share is None and profile is not None and profile.completion_share is not None:
        share = profile.completion_share
        how = f"this device's profile: rows that may stop used {share:.0%} of max_new_tokens"
    model = step_model(cfg, device, profile)
    rows = [(p, c, _completion(b, stops, share)) for p, c, b, stops, _ in scan.unique_rows]
    completions = [r[2] for r in rows]
    returned = sum(r[2] * u[4] for r, u in zip(rows, scan.unique_rows, strict=True))
    if cfg.engine.kind == "static":
        prompts = [r[0] for r in rows]
        forward = model.forward_seconds(
            scan.computed_prompt_tokens, completions, cfg.engine.max_num_seqs, prompts
        )
        steps = 0
    else:
        rep = replay(
            rows,
            model,
            cfg.engine.max_num_seqs,
            cfg.engine.batch_tokens(device.kind),
            cfg.engine.block_size,
        )
        forward, steps = rep.forward_seconds, rep.steps
    overhead = _overheads(profile, steps, scan.rows)
    wall = model.load_s + forward + overhead
    cost = wall * rate.usd_per_hour / 3600
    expected = returned + _follower_completions(scan, share)
    tokens = scan.prompt_tokens + expected
    apis = api_equivalent(scan.prompt_tokens, round(expected), cost, api_prices(cfg.cost))
    return {
        "job": cfg.name,
        "model": cfg.model.source,
        "created_at": time.time(),
        "rows": scan.rows,
        "valid_rows": scan.rows - scan.invalid,
        "invalid_rows": scan.invalid,
        "deduplicated": scan.deduplicated,
        "prompt_tokens": scan.prompt_tokens,
        "computed_prompt_tokens": scan.computed_prompt_tokens,
        "cached_tokens": scan.prompt_tokens - scan.computed_prompt_tokens,  # dedup + prefix cache
        "completion_tokens": round(expected),
        "completion_tokens_max": sum(scan.bounds),
        "decode_tokens": sum(completions),  # generated by the engine (a greedy row's n once)
        "completion_source": how,
        "steps": steps,
        "wall_seconds": wall,
        "forward_seconds": forward,
        "overhead_seconds": overhead,
        "cost_usd": cost,
        "usd_per_hour": rate.usd_per_hour,
        "price_source": rate.label,
        "price_unit": rate.price.unit,
        "price_date": rate.price.date,
        "price_warnings": price_warnings(rate.price.date, apis),
        "usd_per_1m_tokens": cost / tokens * 1e6 if tokens else None,
        "device": str(device),
        "profile": key if profile is not None else None,
        "throughput": {**model.to_json()},
        "api_equivalent": apis,
    }


def _completion(bound: int, can_stop: bool, share: float | None) -> int:
    return bound if share is None or not can_stop else min(bound, max(1, round(bound * share)))


def _follower_completions(scan: Scan, share: float | None) -> float:
    """Duplicates produce their leader's tokens (scan.bounds counts every valid row's n)."""
    unique = sum(b * copies for _, _, b, _, copies in scan.unique_rows)
    extra = sum(scan.bounds) - unique
    return extra * (share if share is not None else 1.0)


def step_model(cfg: JobConfig, device, profile: DeviceProfile | None) -> StepModel:
    """Fitted on this device's measured steps when there are any, else the roofline guess."""
    roof = roofline_model(device, *model_size(cfg), kv_bytes_per_token(cfg))
    if profile is None or not profile.steps:
        return roof
    fit = fit_step_model(profile.steps, profile.load_s or roof.load_s, 0, cfg.engine.block_size)
    return StepModel(
        step_s=fit.step_s,
        token_s=fit.token_s,
        load_s=fit.load_s,
        decode_token_s=fit.decode_token_s,
        context_token_s=fit.context_token_s,
        prefill_context_s=fit.prefill_context_s,
        source=f"this device's profile: {len(profile.steps)} engine steps measured here",
    )


def _overheads(profile: DeviceProfile | None, steps: int, rows: int) -> float:
    """Time outside the steps: in the engine (per step) and around it (per row)."""
    if profile is None:
        return OTHER_S_PER_ROW * rows
    per_row = profile.row_overhead_s
    return steps * profile.step_overhead_s + rows * (
        OTHER_S_PER_ROW if per_row is None else per_row
    )


def model_size(cfg: JobConfig) -> tuple[int, int]:
    """(parameters, bytes per parameter at run time), read from headers, not weights."""

    where = Path(local_dir_or_gguf(cfg.model))
    n = sum(_safetensors_params(f) for f in where.glob("*.safetensors")) if where.is_dir() else 0
    if not n:
        n = _config_params(where)
    dtype_bytes = compute_dtype_bytes(cfg)
    if cfg.model.quantization in ("int8", "fp8"):
        dtype_bytes = 1
    elif cfg.model.quantization == "int4":
        dtype_bytes = 1  # half a byte, rounded up: scales and the 16-bit layers stay
    return n, dtype_bytes


def compute_dtype(cfg: JobConfig) -> str:
    """The dtype the run will compute in: model.dtype, or what `auto` picks on this device
    (on a CPU the dtype probe's cached choice, engine/dtype_probe.py)."""
    if cfg.model.dtype != "auto":
        return cfg.model.dtype
    import torch

    where = torch.device("cuda" if detect_device().kind == "cuda" else "cpu")
    dtype, _ = pick_dtype("auto", where, local_dir_or_gguf(cfg.model))
    return str(dtype).removeprefix("torch.")


def compute_dtype_bytes(cfg: JobConfig) -> int:
    """Bytes of one activation (and KV-cache value, under kv_cache_dtype: auto)."""
    return 4 if compute_dtype(cfg) == "float32" else 2


def kv_bytes_per_token(cfg: JobConfig) -> int:
    """KV-cache bytes one token of context takes (keys and values, every layer), from config:
    the model's dtype, or model.kv_cache_dtype (16 bits; 8-bit codes plus a scale per head)."""
    import torch

    from jobrunner.engine.paged.kv_cache import kv_bytes_per_token as cache_bytes

    dtype = {4: torch.float32, 2: torch.bfloat16}[compute_dtype_bytes(cfg)]
    try:
        c = _hf_config(Path(local_dir_or_gguf(cfg.model)))
        heads = c.num_attention_heads
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // heads
        kv_heads = getattr(c, "num_key_value_heads", None) or heads
    except Exception:  # an architecture without these fields: no context term
        return 0
    return cache_bytes(c.num_hidden_layers, kv_heads, head_dim, dtype, cfg.model.kv_cache_dtype)


def _hf_config(where: Path):
    from transformers import AutoConfig

    if where.suffix == ".gguf":
        return AutoConfig.from_pretrained(str(where.parent), gguf_file=where.name)
    return AutoConfig.from_pretrained(str(where))


def _safetensors_params(path: Path) -> int:
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    total = 0
    for name, t in header.items():
        if name != "__metadata__":
            p = 1
            for d in t["shape"]:
                p *= d
            total += p
    return total


def _config_params(where: Path) -> int:
    """A decoder's parameters from its config (for GGUF sources without safetensors)."""
    with model_files(str(where)):
        c = _hf_config(where)
    h, layers, inter, vocab = c.hidden_size, c.num_hidden_layers, c.intermediate_size, c.vocab_size
    kv = getattr(c, "num_key_value_heads", c.num_attention_heads) / c.num_attention_heads
    per_layer = h * h * (2 + 2 * kv) + 3 * h * inter
    tied = getattr(c, "tie_word_embeddings", False)
    return int(layers * per_layer + vocab * h * (1 if tied else 2))


def save_estimate(cfg: JobConfig, est: dict[str, Any]) -> tuple[Path | None, str]:
    """(estimate.json's path, "") once written into the job's run directory, or (None, why not).

    It is written only where `run` would take output.path as this job's (new, empty, or a run
    of this job: lifecycle.output_state), so a user's folder or another job's run is untouched;
    a store run's goes to its local staging directory, where its report looks for it."""
    from jobrunner.errors import JobError
    from jobrunner.lifecycle import output_state, run_dir
    from jobrunner.resume import job_fingerprint

    try:
        output_state(cfg)
    except JobError as e:  # not this job's folder: the estimate is printed, not saved
        return None, str(e)
    rundir = run_dir(cfg)  # a write the machine refuses (full disk, ulimit -f) raises: 75, 78
    make_run_dir(rundir.path)
    path = rundir.path / ESTIMATE_FILE
    est = {**est, "settings": job_fingerprint(cfg.fingerprint_parts())}  # the report checks it
    write_text_atomic(path, json.dumps(est, indent=2, sort_keys=True))
    return path, ""


def to_text(e: dict[str, Any]) -> str:
    """The estimate for a person (stderr); the JSON summary goes to stdout."""
    t = e["throughput"]
    lines = [
        f"estimate for {e['job']} ({e['model']} on {e['device']})",
        f"  rows                 {e['rows']:,} ({e['invalid_rows']:,} invalid,"
        f" {e['deduplicated']:,} duplicates run once)",
        f"  prompt tokens        {e['prompt_tokens']:,} ({e['computed_prompt_tokens']:,} to compute"
        " after prefix cache and dedup)",
        f"  completion tokens    {e['completion_tokens']:,} ({e['completion_source']})",
        f"  wall time            {e['wall_seconds']:,.1f} s (load {t['load_s']:.1f} s,"
        f" forward {e['forward_seconds']:,.1f} s)",
        f"  cost                 ${e['cost_usd']:,.6f} at ${e['usd_per_hour']:.4f}/h: {e['price_source']}",
        f"  speed model          {t['source']}",
        *[f"  warning              {w}" for w in e.get("price_warnings", [])],
        "  the same tokens at hosted batch APIs:",
        *[
            f"    {a['provider']:<10}{a['model']:<22}${a['usd']:,.6f} (price of {a['date'] or 'no date'})"
            for a in e["api_equivalent"]
        ],
    ]
    return "\n".join(lines)
