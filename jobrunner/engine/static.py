"""The static engine: length-sorted, token-budgeted, left-padded batches through HF `generate`.

The fallback for architectures the paged engine does not cover, and the baseline every benchmark
reports against. Sampling is per row, by the shared sampler (engine/sampler.py): an HF logits
processor runs each row's RowSampler (its processors, its own seeded generator) and forces the
token it picks, so a row's sample does not depend on its batch neighbours.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator
from dataclasses import replace
from itertools import islice

from jobrunner.engine.base import Engine, model_context
from jobrunner.engine.finish import (
    cut_at_end,
    error_result,
    find_stop,
    make_choice,
    make_result,
)
from jobrunner.engine.sampler import RowSampler, sample
from jobrunner.types import FinishReason, Request, Result


def sampling_groups(reqs: list[Request]) -> list[list[Request]]:
    """Requests that can share one generate() call: generate() applies stop strings, end tokens,
    ignore_eos and whether the sampler runs to the whole batch, so those must agree (OpenAI
    batch lines differ)."""
    groups: dict[tuple, list[Request]] = {}
    for r in reqs:
        s = r.sampling
        groups.setdefault((s.stop, s.ignore_eos, s.stop_token_ids, s.plain_greedy), []).append(r)
    return list(groups.values())


def pack_batches(
    reqs: list[Request], max_batch_tokens: int, max_num_seqs: int, context: int = 1 << 30
) -> list[list[Request]]:
    """Sort by prompt length; cut batches so padded (prompt + new) tokens fit the budget, and
    each row's padded width the model's context: generate() runs every row of a batch for the
    batch's most new tokens."""
    batches: list[list[Request]] = []
    cur: list[Request] = []
    for r in sorted(reqs, key=lambda r: r.num_prompt_tokens):
        width = r.num_prompt_tokens + max(x.sampling.max_new_tokens for x in [*cur, r])
        full = len(cur) + 1 > max_num_seqs or (len(cur) + 1) * width > max_batch_tokens
        if cur and (full or width > context):
            batches.append(cur)
            cur = []
        cur.append(r)
    if cur:
        batches.append(cur)
    return batches


def pad_id(pad: int | None, eos: set[int]) -> int:
    """The id left padding is filled with: the tokenizer's pad, else an EOS, else 0 (a base
    model with neither): the attention mask hides the padding, so any id serves."""
    return pad if pad is not None else min(eos, default=0)


def fit_context(r: Request, context: int) -> Request | Result:
    """The row with its new tokens capped to the model's context (model_context), or its error
    where the prompt leaves no room: as the paged engine does, so a model with a learned
    position table (GPT-2's 1024) never indexes past it."""
    n = r.num_prompt_tokens
    if n >= context:
        why = f"{n} prompt tokens leave no room (the model's context, {context} tokens)"
        return error_result(r, "prompt_too_long", why)
    if r.sampling.max_new_tokens <= context - n:
        return r
    return replace(r, sampling=replace(r.sampling, max_new_tokens=context - n))


class StaticEngine(Engine):
    kind = "static"

    def run_samples(self, requests: Iterable[Request]) -> Iterator[Result]:
        it, e = iter(requests), self.cfg.engine
        window = max(e.order_window, e.max_num_seqs)
        budget = e.batch_tokens(self.loaded.device.type)
        context = model_context(self.loaded, self.cfg)
        while not self._stop_requested and (chunk := list(islice(it, window))):
            fitted = [self._admit(r, context) for r in chunk]
            yield from (r for r in fitted if isinstance(r, Result))
            chunk = [r for r in fitted if isinstance(r, Request)]
            batches = [
                b
                for g in sampling_groups(chunk)
                for b in pack_batches(g, budget, e.max_num_seqs, context)
            ]
            for batch in batches:
                if self._stop_requested:
                    return
                yield from self._run_batch(batch)

    def _admit(self, r: Request, context: int) -> Request | Result:
        """The row fitted to the context, or its error: no room, or a spec that does not
        compile (compiled by the prep thread already unless this engine runs without one)."""
        if r.sampling.structured is not None:
            try:
                self.compile_grammar(r.sampling.structured)
            except ValueError as e:  # GrammarError
                return error_result(r, "bad_schema", str(e))
        return fit_context(r, context)

    def _run_batch(self, batch: list[Request]) -> list[Result]:
        import torch

        t0 = time.perf_counter()
        tok = self.loaded.tokenizer
        width = max(r.num_prompt_tokens for r in batch)
        pad = pad_id(tok.pad_token_id, self.loaded.eos_token_ids)
        ids = torch.full((len(batch), width), pad, dtype=torch.long)  # (B, T) left-padded
        mask = torch.zeros_like(ids)
        for i, r in enumerate(batch):
            ids[i, width - r.num_prompt_tokens :] = torch.tensor(r.prompt_token_ids)
            mask[i, width - r.num_prompt_tokens :] = 1
        from transformers import StoppingCriteriaList

        kwargs, rows = self._generate_kwargs(batch, pad)
        stop = StopWhenAsked(self)
        with job_settings_only(self.loaded.model):
            out = self.loaded.model.generate(
                input_ids=ids.to(self.loaded.device),
                attention_mask=mask.to(self.loaded.device),
                stopping_criteria=StoppingCriteriaList([stop]),
                **kwargs,
            )
        if stop.fired:  # cut short by a stop request: its rows are unfinished, and rerun
            return []
        new = out[:, width:].tolist()
        results = [
            self._result(r, toks, row) for r, toks, row in zip(batch, new, rows, strict=True)
        ]
        self._account(batch, results, time.perf_counter() - t0)
        return results

    def _generate_kwargs(self, batch: list[Request], pad: int) -> tuple[dict, list]:
        """generate()'s arguments, and each row's RowSampler (None for plain greedy rows)."""
        from transformers import GenerationConfig, LogitsProcessorList

        s = batch[0].sampling
        max_new = max(r.sampling.max_new_tokens for r in batch)
        cfg = GenerationConfig(
            max_new_tokens=max_new,
            do_sample=False,
            pad_token_id=pad,
            eos_token_id=sorted(s.end_ids(self.loaded.eos_token_ids) or self.loaded.eos_token_ids)
            or None,  # a model without EOS: rows end at their length
            num_beams=1,
        )
        if s.ignore_eos:
            cfg.min_new_tokens = max_new
        kwargs: dict = {"generation_config": cfg}
        if s.stop:
            kwargs.update(stop_strings=list(s.stop), tokenizer=self.loaded.tokenizer)
        rows = [self._sampler(r) for r in batch]
        if all(row.plain and row.logprobs is None for row in rows):
            return kwargs, [None] * len(batch)
        kwargs["logits_processor"] = LogitsProcessorList(
            [ForcePicks(rows, batch, self.loaded.eos_token_ids, pad)]
        )
        return kwargs, rows

    def _sampler(self, r: Request) -> RowSampler:
        """The row's RowSampler, with its grammar's matcher when it is constrained."""
        row = RowSampler.for_request(r, self.loaded.device, self.loaded.eos_token_ids)
        if r.sampling.structured is not None:
            row.add(self.grammars.processor(r.sampling.structured))
        return row

    def _result(self, r: Request, toks: list[int], row) -> Result:
        """Tokens up to the row's end token or its own max_new_tokens (padding dropped)."""
        ends = r.sampling.end_ids(self.loaded.eos_token_ids)
        toks, ended = cut_at_end(toks[: r.sampling.max_new_tokens], ends)
        if r.sampling.stop:
            toks = cut_at_stop(self.loaded.tokenizer, toks, r.sampling.stop)
        reason = FinishReason.STOP if ended else FinishReason.LENGTH
        logprobs = row.logprobs if row is not None else None
        structure = row.structure if row is not None else None
        choice = make_choice(
            self.loaded.tokenizer, r, toks, reason, ends, logprobs, structure=structure
        )
        return make_result(r, [choice])

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


def cut_at_stop(tokenizer, toks: list[int], stops: tuple[str, ...]) -> list[int]:
    """The tokens up to the one that completes the first stop string: generate() ends a row
    there and pads after it, and padding is no token the row generated (nor paid for). A
    prefix's text holds the stop from that token on, so the shortest is found by halving."""

    def stopped(k: int) -> bool:
        return find_stop(tokenizer.decode(toks[:k], skip_special_tokens=True), stops) >= 0

    if not stopped(len(toks)):
        return toks
    lo, hi = 1, len(toks)  # stopped(hi), and not stopped(lo - 1)
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if stopped(mid) else (mid + 1, hi)
    return toks[:lo]


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


@contextlib.contextmanager
def job_settings_only(model) -> Iterator[None]:
    """generate() fills every setting its GenerationConfig leaves unset from the checkpoint's
    generation_config.json (a repetition_penalty, no_repeat_ngram_size, suppressed or forced
    tokens): the job's generation settings alone must decide a row's tokens, as they do on the
    paged engine. For the call, the model's own config keeps only its token ids."""
    from transformers import GenerationConfig

    own = model.generation_config
    ids = ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id")
    model.generation_config = GenerationConfig(**{k: getattr(own, k, None) for k in ids})
    try:
        yield
    finally:
        model.generation_config = own


class StopWhenAsked:
    """An HF stopping criterion that ends generate() at the next token once the engine is asked
    to stop (a SIGTERM would otherwise wait for the whole batch's max_new_tokens); `fired` says
    the batch was cut short, so that none of its rows is taken as finished."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.fired = False

    def __call__(self, input_ids, scores, **kwargs):  # input_ids: (B, T)
        import torch

        self.fired = self.fired or self.engine.stop_requested
        return torch.full((input_ids.shape[0],), self.fired, device=input_ids.device)


class ForcePicks:
    """An HF logits processor that lets each row's RowSampler pick its token (processors,
    seeded draw, logprobs of the raw scores) and forces it: only that token stays finite, so
    generate()'s greedy step takes it. A row is done once it picked an end token or its own
    max_new_tokens (generate() runs the batch to the longest): its sampler (a grammar's matcher,
    its logprobs) sees no token past its end, and `idle` is forced in its place (padding, or cut
    off by `_result`)."""

    def __init__(
        self, rows: list[RowSampler], batch: list[Request], eos: Iterable[int], idle: int
    ) -> None:
        self.rows = rows
        self.ends = [r.sampling.end_ids(eos) for r in batch]
        self.limits = [r.sampling.max_new_tokens for r in batch]
        self.live = list(range(len(rows)))
        self.idle = idle

    def __call__(self, input_ids, scores):  # scores: (B, V)
        import torch

        out = torch.full_like(scores, float("-inf"))
        out[:, self.idle] = 0.0
        if not self.live:
            return out
        live = self.live
        tokens, _, logprobs = sample(scores[live].float(), [self.rows[i] for i in live])
        out[live] = float("-inf")
        out[live, tokens] = 0.0
        for i, t, lp in zip(live, tokens, logprobs, strict=True):
            self.rows[i].accept([t], [lp])
        self.live = [
            i
            for i, t in zip(live, tokens, strict=True)
            if t not in self.ends[i] and len(self.rows[i].output_ids) < self.limits[i]
        ]
        return out
