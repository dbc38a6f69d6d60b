"""The quality gate (`model.quality_check: N`): what quantization costs, measured before the run.

On N sampled rows the job's own engine writes greedy completions of the first K tokens, once
with the original model (the references) and once quantized (weights and KV cache as the job
asks). Then both models score the references teacher-forced, one batched forward pass each:
  agreement       share of the reference tokens the quantized model also ranks first (gated by
                  `model.quality_min_agreement`: exit 65 before the full run when below it);
                  `agreement_unquantized` is the same for the original model (below 1 where
                  the engine's numerics differ from a full forward pass: the noise floor);
  ppl_change      perplexity of the references, quantized / original - 1;
  exact_prefix    share of the first K generated tokens equal position by position (free
                  running: one early divergence makes every later token count as different;
                  the only figure that includes the KV cache's quantization).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F

from jobrunner.engine.engines import make_engine
from jobrunner.engine.quant.sample import sample_requests
from jobrunner.errors import InputDataError
from jobrunner.types import Request, SamplingParams

log = logging.getLogger(__name__)

MAX_K = 32  # reference tokens per row


class QualityBelowThreshold(InputDataError):
    """The quantized model agrees with the original less than model.quality_min_agreement."""


@dataclass
class Quality:
    rows: int
    tokens: int  # reference tokens scored
    first_k: int
    agreement: float
    agreement_unquantized: float  # the same figure for the original model: the noise floor
    exact_prefix: float
    ppl_reference: float
    ppl_quantized: float
    ppl_change: float

    def to_json(self) -> dict[str, Any]:
        return {k: round(v, 6) if isinstance(v, float) else v for k, v in asdict(self).items()}


def greedy_requests(reqs: list[Request], k: int) -> list[Request]:
    params = SamplingParams(max_new_tokens=k)
    return [dataclasses.replace(r, sampling=params) for r in reqs]


def generate_tokens(
    loaded: Any, cfg: Any, reqs: list[Request], kv_cache_dtype: str
) -> dict[str, list[int]]:
    """Completion tokens per request id, from the job's engine kind with a small KV cache."""

    tokens = sum(r.num_prompt_tokens + r.sampling.max_new_tokens for r in reqs) + 64 * len(reqs)
    job = cfg.model_copy(deep=True)
    job.model.kv_cache_dtype = kv_cache_dtype
    job.engine.kv_cache_bytes = tokens * kv_bytes_upper_bound(loaded.hf_config)
    job.engine.prefix_caching = False
    engine = make_engine(loaded, job)
    return {res.id: list(res.token_ids) for res in engine.generate(iter(reqs))}


def kv_bytes_upper_bound(hf_config: Any) -> int:
    """KV bytes per token at float32: enough for any cache dtype."""
    heads = hf_config.num_attention_heads
    nkv = getattr(hf_config, "num_key_value_heads", None) or heads
    hd = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads
    return 2 * hf_config.num_hidden_layers * nkv * hd * 4


@torch.inference_mode()
def nll_and_top1(model: Any, prompts: list[list[int]], refs: list[list[int]]):
    """Teacher-forced -log p and top-1 of every reference token: one right-padded batch."""
    device = next(model.parameters()).device
    seqs = [p + r for p, r in zip(prompts, refs, strict=True)]
    width = max(len(s) for s in seqs)
    ids = torch.zeros((len(seqs), width), dtype=torch.long, device=device)  # (B, W)
    mask = torch.zeros_like(ids)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, : len(s)] = 1
    logits = model(input_ids=ids, attention_mask=mask).logits  # (B, W, V)
    nll, top1 = [], []
    for i, (p, r) in enumerate(zip(prompts, refs, strict=True)):
        rows = logits[i, len(p) - 1 : len(p) - 1 + len(r)].float()  # (n, V)
        nll.append(
            F.cross_entropy(
                rows, torch.tensor(r, dtype=torch.long, device=device), reduction="none"
            ).cpu()
        )
        top1.append(rows.argmax(-1).cpu())
    return torch.cat(nll), torch.cat(top1)


def exact_prefix(refs: list[list[int]], outs: list[list[int]], k: int) -> float:
    """Position-wise equality over the first k tokens (a missing token counts as different)."""
    total = sum(max(len(r), len(o)) for r, o in zip(refs, outs, strict=True))
    same = sum(a == b for r, o in zip(refs, outs, strict=True) for a, b in zip(r, o, strict=False))
    return same / total if total else 1.0


def run_quality_check(loaded: Any, cfg: Any, quantize) -> Quality:
    """Measure on cfg.model.quality_check sampled rows; `quantize()` quantizes loaded.model."""

    k = min(cfg.generation.max_new_tokens, MAX_K)
    reqs = greedy_requests(sample_requests(cfg, loaded.tokenizer, cfg.model.quality_check), k)
    prompts = [r.prompt_token_ids for r in reqs]
    ref = generate_tokens(loaded, cfg, reqs, "auto")
    refs = [ref[r.id] for r in reqs]
    nll_ref, top1_ref = nll_and_top1(loaded.model, prompts, refs)
    quantize()
    nll_q, top1_q = nll_and_top1(loaded.model, prompts, refs)
    got = generate_tokens(loaded, cfg, reqs, cfg.model.kv_cache_dtype)
    target = torch.tensor([t for r in refs for t in r], dtype=torch.long)
    n = len(target)
    ppl_ref, ppl_q = math.exp(float(nll_ref.mean())), math.exp(float(nll_q.mean()))
    q = Quality(
        len(reqs),
        n,
        k,
        _share(top1_q, target),
        _share(top1_ref, target),
        exact_prefix(refs, [got[r.id] for r in reqs], k),
        ppl_ref,
        ppl_q,
        ppl_q / ppl_ref - 1,
    )
    log.info(
        "quality check, %d rows x %d tokens: agreement %.3f, exact prefix %.3f, perplexity"
        " %.3f -> %.3f (%+.1f%%)",
        q.rows,
        k,
        q.agreement,
        q.exact_prefix,
        q.ppl_reference,
        q.ppl_quantized,
        100 * q.ppl_change,
    )
    return q


def _share(top1: torch.Tensor, target: torch.Tensor) -> float:
    return float((top1 == target).float().mean()) if len(target) else 1.0


def enforce(q: Quality, cfg: Any) -> None:
    need = cfg.model.quality_min_agreement
    if need is not None and q.agreement < need:
        raise QualityBelowThreshold(
            f"model.quality_min_agreement: the {cfg.model.quantization} model ranks first"
            f" {q.agreement:.1%} of the reference tokens (first {q.first_k} tokens of {q.rows}"
            f" sampled rows), below the required {need:.1%} (perplexity {q.ppl_change:+.1%});"
            " keep more layers in 16-bit (`jobrunner quantize-check`), use a wider format, or"
            " lower the bar"
        )
