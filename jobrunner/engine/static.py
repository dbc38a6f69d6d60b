"""The static engine: length-sorted, token-budgeted, left-padded batches through HF `generate`.

The fallback for architectures the paged engine does not cover, and the baseline every benchmark
reports against. Sampling is per row: a logits processor draws each row's token from its own
seeded generator, so a row's sample does not depend on its batch neighbours.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from itertools import islice

from jobrunner.engine.base import Engine
from jobrunner.engine.finish import error_result, make_result
from jobrunner.engine.sampling import sample_row
from jobrunner.types import Request, Result


def sampling_groups(reqs: list[Request]) -> list[list[Request]]:
    """Requests that can share one generate() call: generate() applies stop strings, ignore_eos
    and greedy-vs-sampled to the whole batch, so those must agree (OpenAI batch lines differ)."""
    groups: dict[tuple, list[Request]] = {}
    for r in reqs:
        groups.setdefault((r.sampling.stop, r.sampling.ignore_eos, r.sampling.greedy), []).append(r)
    return list(groups.values())


def pack_batches(
    reqs: list[Request], max_batch_tokens: int, max_num_seqs: int
) -> list[list[Request]]:
    """Sort by prompt length; cut batches so padded (prompt + new) tokens fit the budget."""
    batches: list[list[Request]] = []
    cur: list[Request] = []
    for r in sorted(reqs, key=lambda r: r.num_prompt_tokens):
        width = r.num_prompt_tokens + max(x.sampling.max_new_tokens for x in [*cur, r])
        if cur and (len(cur) + 1 > max_num_seqs or (len(cur) + 1) * width > max_batch_tokens):
            batches.append(cur)
            cur = []
        cur.append(r)
    if cur:
        batches.append(cur)
    return batches


def _unconstrained(r: Request) -> Result:
    return error_result(
        r,
        "unsupported",
        "structured outputs (response_format, choice, regex, tools) need the paged engine;"
        " this model runs on the static engine",
    )


class StaticEngine(Engine):
    kind = "static"

    def generate(self, requests: Iterable[Request]) -> Iterator[Result]:
        it = iter(requests)
        window = max(self.cfg.engine.order_window, self.cfg.engine.max_num_seqs)
        while not self._stop_requested and (chunk := list(islice(it, window))):
            yield from (_unconstrained(r) for r in chunk if r.sampling.structured is not None)
            chunk = [r for r in chunk if r.sampling.structured is None]
            e = self.cfg.engine
            batches = [
                b
                for g in sampling_groups(chunk)
                for b in pack_batches(g, e.max_batch_tokens, e.max_num_seqs)
            ]
            for batch in batches:
                if self._stop_requested:
                    return
                yield from self._run_batch(batch)

    def _run_batch(self, batch: list[Request]) -> list[Result]:
        import torch

        t0 = time.perf_counter()
        tok = self.loaded.tokenizer
        width = max(r.num_prompt_tokens for r in batch)
        pad = tok.pad_token_id if tok.pad_token_id is not None else min(self.loaded.eos_token_ids)
        ids = torch.full((len(batch), width), pad, dtype=torch.long)  # (B, T) left-padded
        mask = torch.zeros_like(ids)
        for i, r in enumerate(batch):
            ids[i, width - r.num_prompt_tokens :] = torch.tensor(r.prompt_token_ids)
            mask[i, width - r.num_prompt_tokens :] = 1
        out = self.loaded.model.generate(
            input_ids=ids.to(self.loaded.device),
            attention_mask=mask.to(self.loaded.device),
            **self._generate_kwargs(batch, pad),
        )
        new = out[:, width:].tolist()
        eos = self.loaded.eos_token_ids
        results = [
            make_result(r, self._trim(r, toks), tok, eos)
            for r, toks in zip(batch, new, strict=True)
        ]
        self._account(batch, results, time.perf_counter() - t0)
        return results

    def _generate_kwargs(self, batch: list[Request], pad: int) -> dict:
        from transformers import GenerationConfig, LogitsProcessorList

        s = batch[0].sampling
        max_new = max(r.sampling.max_new_tokens for r in batch)
        cfg = GenerationConfig(
            max_new_tokens=max_new,
            do_sample=False,
            pad_token_id=pad,
            eos_token_id=sorted(self.loaded.eos_token_ids),
            num_beams=1,
        )
        if s.ignore_eos:
            cfg.min_new_tokens = max_new
        kwargs: dict = {"generation_config": cfg}
        if s.stop:
            kwargs.update(stop_strings=list(s.stop), tokenizer=self.loaded.tokenizer)
        if not s.greedy:
            kwargs["logits_processor"] = LogitsProcessorList(
                [RowSampler(batch, self.loaded.device)]
            )
        return kwargs

    def _trim(self, r: Request, toks: list[int]) -> list[int]:
        """Drop padding after a row finished and tokens past the row's own max_new_tokens."""
        return toks[: r.sampling.max_new_tokens]

    def _account(self, batch: list[Request], results: list[Result], seconds: float) -> None:
        st = self.stats
        st.steps += 1
        st.row_seconds += seconds
        attribute_batch(batch, results, seconds)
        st.engine_seconds += seconds
        st.forward_seconds += seconds
        st.prefill_tokens += sum(r.num_prompt_tokens for r in batch)
        completion = sum(r.usage.completion_tokens for r in results)
        st.decode_tokens += completion
        st.generated_tokens += completion
        st.step_log.append(
            {
                "t": time.time(),
                "num_running": len(batch),
                "batch_tokens": sum(r.num_prompt_tokens for r in batch),
                "step_seconds": seconds,
            }
        )


def attribute_batch(batch: list[Request], results: list[Result], seconds: float) -> None:
    """One generate() call: its time shared by the tokens each row needed (prompt and output)."""
    need = [
        r.num_prompt_tokens + res.usage.completion_tokens
        for r, res in zip(batch, results, strict=True)
    ]
    total = max(sum(need), 1)
    for r, res, n in zip(batch, results, need, strict=True):
        res.usage.add_step(r.num_prompt_tokens, False, 0.0)
        res.usage.add_step(res.usage.completion_tokens, True, seconds * n / total)


class RowSampler:
    """A logits processor that samples each row with its own generator and forces that token.

    generate() runs greedy; this processor leaves only the sampled token finite, so greedy picks
    it. Rows keep their own torch.Generator seeded from Request.seq_seed.
    """

    def __init__(self, batch: list[Request], device) -> None:
        import torch

        self.params = [r.sampling for r in batch]
        self.gens = [torch.Generator(device=device).manual_seed(r.seq_seed) for r in batch]

    def __call__(self, input_ids, scores):  # scores: (B, V)
        import torch

        out = torch.full_like(scores, float("-inf"))
        for i, (p, g) in enumerate(zip(self.params, self.gens, strict=True)):
            out[i, sample_row(scores[i].float(), p, g)] = 0.0
        return out
