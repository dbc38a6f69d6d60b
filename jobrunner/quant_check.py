"""`jobrunner quantize-check`: how much each linear layer suffers from quantization.

Each `nn.Linear`'s inputs are captured on N sampled prompts (a forward pass of the original
model); the layer is then quantized alone and its relative output error measured on those
inputs, ||W x - Q(W) x|| / ||W x||. The plan keeps lm_head (the logits feed every token
choice directly) and the most sensitive KEEP_FRACTION of the other layers in 16-bit; it can be
written into the job as `model.keep_in_16bit`.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jobrunner.errors import ConfigError, InputDataError
from jobrunner.io.writers import check_file_target, write_text_atomic

KEEP_FRACTION = 0.05  # of the linear layers, the most sensitive, besides lm_head
MAX_ROWS = 512  # captured input rows per layer (a seeded subsample of the prompt tokens)


@dataclass
class LayerError:
    name: str
    in_features: int
    out_features: int
    rel_error: float


def capture_inputs(model: Any, names: list[str], prompts: list[list[int]]) -> dict[str, Any]:
    """Inputs (rows, K) of each named Linear over the prompts; at most MAX_ROWS rows each."""
    import torch

    per_prompt = max(1, MAX_ROWS // max(1, len(prompts)))
    gen = torch.Generator().manual_seed(0)
    seen: dict[str, list] = {n: [] for n in names}

    def hook(name):
        def pre(module, args):
            x = args[0].reshape(-1, args[0].shape[-1])  # (T, K)
            pick = torch.randperm(x.shape[0], generator=gen)[:per_prompt].sort().values
            seen[name].append(x[pick.to(x.device)].clone())

        return pre

    handles = [model.get_submodule(n).register_forward_pre_hook(hook(n)) for n in names]
    try:
        device = next(model.parameters()).device
        with torch.inference_mode():
            for ids in prompts:
                model(input_ids=torch.tensor([ids], device=device))
    finally:
        for h in handles:
            h.remove()
    return {n: torch.cat(xs) for n, xs in seen.items() if xs}


def layer_errors(model: Any, quantizer: Any, inputs: dict[str, Any]) -> list[LayerError]:
    import torch

    out = []
    with torch.inference_mode():
        for name, x in inputs.items():
            lin = model.get_submodule(name)
            if quantizer.supports(lin.weight):
                continue
            ql = quantizer.linear(quantizer.quantize_weight(lin.weight.detach()), lin.bias)
            y, yq = lin(x).float(), ql(x).float()
            err = float((y - yq).norm() / y.norm().clamp(min=1e-12))
            out.append(LayerError(name, lin.in_features, lin.out_features, err))
    return sorted(out, key=lambda e: -e.rel_error)


def propose(errors: list[LayerError], fraction: float = KEEP_FRACTION) -> list[str]:
    """lm_head plus the most sensitive `fraction` of the other layers (at least one)."""
    names = [e.name for e in errors]
    others = [n for n in names if n != "lm_head"]
    k = max(1, math.ceil(fraction * len(others))) if others else 0
    plan = (["lm_head"] if "lm_head" in names else []) + others[:k]
    return plan


def run_check(
    cfg: Any, sample: int, quantization: str | None, write: Path | None
) -> dict[str, Any]:
    from jobrunner.engine.loader import load_model
    from jobrunner.engine.quant import QUANTIZERS, check_quantization, linear_names
    from jobrunner.engine.quant.sample import sample_requests

    mode = quantization or (cfg.model.quantization if cfg.model.quantization != "none" else "int8")
    if mode not in QUANTIZERS or mode == "none":
        raise ConfigError(f"--quantization: {mode!r} is not one of int8, int4, fp8")
    cfg.model.quantization = mode
    if write is not None:  # before minutes of measuring, not after
        check_file_target(write, "--write")
    if cfg.engine.num_threads:
        import torch

        torch.set_num_threads(cfg.engine.num_threads)
    loaded = load_model(cfg.model)
    quantizer = check_quantization(cfg.model, loaded.device, loaded.dtype)
    reqs = sample_requests(cfg, loaded.tokenizer, sample)
    if not reqs:
        raise InputDataError(f"{cfg.input.path}: no valid rows to sample prompts from")
    inputs = capture_inputs(
        loaded.model, linear_names(loaded.model), [r.prompt_token_ids for r in reqs]
    )
    errors = layer_errors(loaded.model, quantizer, inputs)
    plan = propose(errors)
    print_table(errors, plan, quantizer.name, len(reqs))
    if write is not None:
        write_plan(Path(cfg.source_file), write, quantizer.name, plan)
    return {
        "status": "ok",
        "quantization": quantizer.name,
        "sampled_rows": len(reqs),
        "layers": len(errors),
        "keep_in_16bit": plan,
        "errors": {e.name: round(e.rel_error, 6) for e in errors},
        "written": str(write) if write else None,
    }


def print_table(
    errors: list[LayerError], plan: list[str], mode: str, rows: int, top: int = 15
) -> None:
    w = sys.stderr.write
    w(
        f"{mode}: relative output error of each linear layer on {rows} sampled prompts"
        f" (worst {min(top, len(errors))} of {len(errors)})\n"
    )
    for e in errors[:top]:
        mark = "  keep 16-bit" if e.name in plan else ""
        w(f"  {e.rel_error:9.5f}  {e.name} ({e.in_features}->{e.out_features}){mark}\n")
    med = sorted(x.rel_error for x in errors)[len(errors) // 2] if errors else 0.0
    w(f"median {med:.5f}; proposed model.keep_in_16bit: {plan}\n")


def write_plan(job_file: Path, target: Path, mode: str, plan: list[str]) -> None:
    """The job file with model.quantization and model.keep_in_16bit set (YAML re-emitted:
    comments are not kept)."""
    import yaml

    from jobrunner.config import relocate_paths

    data = yaml.safe_load(job_file.read_text(encoding="utf-8")) or {}
    relocate_paths(data, job_file, target)  # relative paths name the same files from there
    data.setdefault("model", {}).update(quantization=mode, keep_in_16bit=plan)
    write_text_atomic(target, yaml.safe_dump(data, sort_keys=False, allow_unicode=True))


# ---------------------------------------------------------------- the report's section (no torch)


def report_section(run: dict[str, Any]) -> dict[str, Any]:
    """Weights, KV cache and quality figures of a run record (manifest.runs[-1])."""
    return {
        "dtype": run.get("dtype"),
        "dtype_reason": run.get("dtype_reason"),
        "quantization": run.get("quantization", "none"),
        "kv_cache_dtype": run.get("kv_cache_dtype", "auto"),
        "weight_bytes": run.get("weight_bytes"),
        "kv_bytes_per_token": run.get("kv_bytes_per_token"),
        "num_kv_blocks": run.get("num_kv_blocks"),
        "keep_in_16bit": run.get("keep_in_16bit", []),
        "quality": run.get("quality"),
    }


def markdown_lines(s: dict[str, Any] | None) -> list[str]:
    if not s or s.get("weight_bytes") is None:
        return []
    kv = s["kv_bytes_per_token"]
    lines = [
        "## Weights and KV cache",
        "",
        "| what | value |",
        "| --- | --- |",
        f"| weights | {s['quantization']}, {s['weight_bytes']:,} bytes |",
        *([f"| compute dtype | {s['dtype']} ({s['dtype_reason']}) |"] if s.get("dtype") else []),
        f"| KV cache | {s['kv_cache_dtype']}, {kv:,} bytes/token, {s['num_kv_blocks']:,} blocks |"
        if kv
        else f"| KV cache | {s['kv_cache_dtype']} |",
    ]
    if s["keep_in_16bit"]:
        lines.append(f"| kept in 16-bit | {', '.join(s['keep_in_16bit'])} |")
    q = s.get("quality")
    if q:
        lines += [
            f"| token agreement (first {q['first_k']} tokens, {q['rows']} rows) |"
            f" {q['agreement']:.1%} (original model: {q.get('agreement_unquantized', 1):.1%});"
            f" exact prefix {q.get('exact_prefix', 0):.1%} |",
            f"| perplexity of the references | {q['ppl_reference']:.3f} ->"
            f" {q['ppl_quantized']:.3f} ({q['ppl_change']:+.1%}) |",
        ]
    return [*lines, ""]
