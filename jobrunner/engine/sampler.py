"""The one sampler: every engine and device path picks next tokens here, after the forward.

The logits-processor seam (the contract):
- Each row owns one `RowSampler` for its whole life: made when the engine takes the row in,
  kept across preemption and recompute (it rides on the row's `sched.Sequence`), dropped when
  the row finishes. It holds the row's processor chain, its own seeded generator (a row's
  samples depend only on its logits and seed, never on its batch neighbours), its token history
  (`prompt_ids`, `output_ids`) and, when asked, the logprobs of its kept tokens.
- A processor (`LogitsProcessor`) is called as `processor(logits, row) -> logits` on one row's
  (V,) float32 logits (the raw model output, already changed by the processors before it in
  the chain); it may write into them in place. It reads the row's history from `row`.
- `accept(tokens)` tells every processor of the row the tokens the row kept this step, in order
  (a grammar matcher advances here). It is called once per kept token list, never for tokens
  of a dropped step (an out-of-memory retry) or rejected draft tokens.
- `allows_drafts = False` on any processor of a row means the row gets no speculative drafts
  (processors that read the history: penalties, min_tokens, grammars). History-free ones
  (logit bias) allow them: every position of a row's drafts is processed with the same history.
- The chain: `processors` (min_tokens, logit_bias, repetition, presence/frequency penalties,
  then whatever `RowSampler.add` plugs in, e.g. a grammar's token bitmask), then, for sampled
  rows only, the `warpers` (temperature, top-k, top-p, min-p), as HF and vLLM order them.
  Greedy rows take the argmax of the processed logits; sampled rows draw from their softmax.
- A `batched` processor (a grammar's token bitmask, structured/grammar.py) is run by its class
  for all its rows of a step at once (one bitmask fill, one masking pass), before the per-row
  chain: it must commute with the other links, as a mask to -inf does.
- Rows with no processor and no warper (plain greedy) take the fast path: one argmax over the
  whole batch. Logprobs, where asked, are batched too: log_softmax of the raw logits, before any
  processor (vLLM's default "raw_logprobs"), so they are the model's own distribution.

A new kind of processor plugs in through `PROCESSOR_FACTORIES`: a factory takes a Request and
returns a processor for it, or None. Every engine's rows get them, since every engine builds its
rows with `RowSampler.for_request`. (The paged engine adds a constrained row's grammar matcher
with `RowSampler.add` itself: it comes from the engine's compiled-grammar cache.)

Engines call `sample(logits, rows)` on the logits of a step (eager forward, CUDA-graph replay or
Triton path alike) and `row.accept(kept, logprobs)` with what each row kept.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from jobrunner.types import Request, SamplingParams, TokenLogprob

SEED_MASK = 0xFFFF_FFFF_FFFF_FFFF


class LogitsProcessor:
    """Base of the chain's links: override `__call__`; `accept`, `allows_drafts`, `batched`
    and `structure` as needed."""

    allows_drafts = False
    # True: the class's `apply_batch` runs this kind for every row of a step at once, before
    # the per-row chain; only for processors that commute with every other link (a mask to
    # -inf does: every built-in processor and warper keeps -inf at -inf)
    batched = False
    structure: str | None = None  # a verdict on the row's output, kept as Choice.structure

    def __call__(self, logits: torch.Tensor, row: RowSampler) -> torch.Tensor:  # (V,) -> (V,)
        raise NotImplementedError

    @classmethod
    def apply_batch(
        cls, logits: torch.Tensor, processors: list[LogitsProcessor], rows: list[int]
    ) -> None:
        """processors[k] changes logits (R, V) row rows[k], in place."""
        for p, i in zip(processors, rows, strict=True):
            logits[i] = p(logits[i], None)

    def accept(self, tokens: list[int]) -> None:
        """The tokens the row kept this step, in order."""


# ---------------------------------------------------------------------- processors


class MinTokens(LogitsProcessor):
    """Ban the tokens that would end the row (EOS, stop_token_ids) before min_tokens."""

    def __init__(self, min_tokens: int, banned: Iterable[int]):
        self.min_tokens = min_tokens
        self.banned = sorted(banned)

    def __call__(self, logits, row):
        if len(row.output_ids) < self.min_tokens:
            logits[self.banned] = float("-inf")
        return logits


class LogitBias(LogitsProcessor):
    """OpenAI's logit_bias: add a fixed bias to the named tokens' logits."""

    allows_drafts = True

    def __init__(self, bias: tuple[tuple[int, float], ...]):
        self.ids = [t for t, _ in bias]
        self.values = [b for _, b in bias]
        self._tensors = None

    def __call__(self, logits, row):
        if self._tensors is None:
            ids = torch.tensor(self.ids, dtype=torch.long, device=logits.device)
            self._tensors = ids, torch.tensor(self.values, dtype=logits.dtype, device=logits.device)
        ids, values = self._tensors
        logits[ids] += values
        return logits


class RepetitionPenalty(LogitsProcessor):
    """HF's RepetitionPenaltyLogitsProcessor: every token of the prompt and the output so far
    has its logit divided by the penalty (multiplied, when negative)."""

    def __init__(self, penalty: float):
        self.penalty = penalty
        self.seen: torch.Tensor | None = None  # (V,) bool

    def __call__(self, logits, row):
        if self.seen is None:
            self.seen = torch.zeros(logits.shape[-1], dtype=torch.bool, device=logits.device)
            self.seen[torch.tensor(row.prompt_ids + row.output_ids, device=logits.device)] = True
        p = self.penalty
        return torch.where(self.seen, torch.where(logits < 0, logits * p, logits / p), logits)

    def accept(self, tokens):
        if self.seen is not None:
            self.seen[tokens] = True


class PresenceFrequencyPenalty(LogitsProcessor):
    """OpenAI's penalties over the output so far: minus presence once a token appeared, minus
    frequency for each time it did."""

    def __init__(self, presence: float, frequency: float):
        self.presence, self.frequency = presence, frequency
        self.counts: torch.Tensor | None = None  # (V,) float32

    def __call__(self, logits, row):
        if self.counts is None:
            self.counts = torch.zeros(logits.shape[-1], dtype=logits.dtype, device=logits.device)
            self._count(row.output_ids)
        return logits - self.frequency * self.counts - self.presence * (self.counts > 0)

    def accept(self, tokens):
        if self.counts is not None:
            self._count(tokens)

    def _count(self, tokens: list[int]) -> None:
        if tokens:
            ids = torch.tensor(tokens, device=self.counts.device)
            self.counts.index_put_((ids,), torch.ones_like(ids, dtype=self.counts.dtype), True)


class Temperature(LogitsProcessor):
    def __init__(self, temperature: float):
        self.temperature = temperature

    def __call__(self, logits, row):
        return logits / self.temperature


class TopK(LogitsProcessor):
    """Keep the k largest logits (ties at the k-th all stay, as HF's TopKLogitsWarper)."""

    def __init__(self, k: int):
        self.k = k

    def __call__(self, logits, row):
        kth = torch.topk(logits, min(self.k, logits.shape[-1])).values[-1]
        return logits.masked_fill(logits < kth, float("-inf"))


class TopP(LogitsProcessor):
    """Keep the smallest set of most likely tokens whose probability mass reaches top_p."""

    def __init__(self, top_p: float):
        self.top_p = top_p

    def __call__(self, logits, row):
        sorted_probs, order = torch.softmax(logits, -1).sort(descending=True)
        outside = sorted_probs.cumsum(-1) - sorted_probs > self.top_p  # the mass before it suffices
        drop = torch.zeros_like(outside).scatter_(-1, order, outside)
        return logits.masked_fill(drop, float("-inf"))


class MinP(LogitsProcessor):
    """Drop tokens less likely than min_p times the most likely one (HF's MinPLogitsWarper)."""

    def __init__(self, min_p: float):
        self.min_p = min_p

    def __call__(self, logits, row):
        probs = torch.softmax(logits, -1)
        return logits.masked_fill(probs < self.min_p * probs.max(), float("-inf"))


def processors_for(p: SamplingParams, end_ids: Iterable[int]) -> list[LogitsProcessor]:
    """The logit processors a row's parameters ask for (end_ids: what min_tokens bans)."""
    out: list[LogitsProcessor] = []
    if p.min_tokens:
        out.append(MinTokens(p.min_tokens, end_ids))
    if p.logit_bias:
        out.append(LogitBias(p.logit_bias))
    if p.repetition_penalty != 1.0:
        out.append(RepetitionPenalty(p.repetition_penalty))
    if p.presence_penalty or p.frequency_penalty:
        out.append(PresenceFrequencyPenalty(p.presence_penalty, p.frequency_penalty))
    return out


def warpers_for(p: SamplingParams) -> list[LogitsProcessor]:
    """What shapes a sampled row's distribution; greedy rows need none (argmax is unchanged)."""
    if p.greedy:
        return []
    out: list[LogitsProcessor] = [Temperature(p.temperature)]
    if p.top_k > 0:
        out.append(TopK(p.top_k))
    if p.top_p < 1.0:
        out.append(TopP(p.top_p))
    if p.min_p > 0.0:
        out.append(MinP(p.min_p))
    return out


ProcessorFactory = Callable[[Request], "LogitsProcessor | None"]
PROCESSOR_FACTORIES: list[ProcessorFactory] = []  # run for every row, in order


def processor_factory(fn: ProcessorFactory) -> ProcessorFactory:
    """Register a factory of per-row processors (a decorator)."""
    PROCESSOR_FACTORIES.append(fn)
    return fn


# ---------------------------------------------------------------------- one row


class RowSampler:
    """One row's sampling state for its whole life (see the module docstring)."""

    def __init__(
        self,
        params: SamplingParams,
        seed: int,
        device: torch.device,
        prompt_ids: list[int],
        eos: Iterable[int] = (),
    ):
        self.params = params
        self.prompt_ids = list(prompt_ids)
        self.output_ids: list[int] = []
        self.processors: list[LogitsProcessor] = []  # the chain, in order (accept, drafts)
        self.per_row: list[LogitsProcessor] = []  # ... those `pick` runs (not batched)
        self.batched: list[LogitsProcessor] = []  # ... those `sample` runs for the batch
        for p in processors_for(params, params.end_ids(eos)):
            self.add(p)
        self.warpers = warpers_for(params)
        self.generator = None
        if not params.greedy:
            self.generator = torch.Generator(device=device)
            self.generator.manual_seed(seed & SEED_MASK)
        self.logprobs: list[TokenLogprob] | None = [] if params.logprobs else None

    @classmethod
    def for_request(cls, req: Request, device: torch.device, eos: Iterable[int]) -> RowSampler:
        """A row's sampler: its parameters' processors, then the registered factories'."""
        row = cls(req.sampling, req.seq_seed, device, req.prompt_token_ids, eos)
        for factory in PROCESSOR_FACTORIES:
            if (p := factory(req)) is not None:
                row.add(p)
        return row

    def add(self, processor: LogitsProcessor) -> None:
        """Plug a processor into the chain, after the built-in ones, before the warpers."""
        self.processors.append(processor)
        (self.batched if processor.batched else self.per_row).append(processor)

    @property
    def plain(self) -> bool:
        """Greedy with nothing to apply: the batch argmax is this row's token."""
        return not self.processors and not self.warpers

    @property
    def structure(self) -> str | None:
        """The first verdict a processor gives on the output (a grammar's), or None."""
        return next((p.structure for p in self.processors if p.structure is not None), None)

    @property
    def allows_drafts(self) -> bool:
        return all(p.allows_drafts for p in self.processors) and not self.warpers

    def pick(self, logits: torch.Tensor) -> int:  # (V,) float32, this row's own to change
        for p in self.per_row:  # the batched ones already ran on the batch (`sample`)
            logits = p(logits, self)
        if self.generator is None:
            return int(torch.argmax(logits))
        for w in self.warpers:
            logits = w(logits, self)
        probs = torch.softmax(logits, dim=-1)
        return int(torch.multinomial(probs, 1, generator=self.generator))

    def accept(self, tokens: list[int], logprobs: list[TokenLogprob | None] | None = None) -> None:
        """The tokens this row kept this step (and their logprobs, from `sample`)."""
        self.output_ids += tokens
        for p in self.processors:
            p.accept(tokens)
        if self.logprobs is not None and logprobs is not None:
            self.logprobs += [lp for lp in logprobs if lp is not None]


# ---------------------------------------------------------------------- a batch


def sample(
    logits: torch.Tensor,
    rows: list[RowSampler],
    row_max: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor] | None] | None = None,
) -> tuple[list[int], list[bool], list[TokenLogprob | None]]:
    """Tokens for each row of logits (R, V), whether the row's logits were usable, and each
    row's logprob entry (None unless it asks). A NaN or +inf anywhere in a row becomes its
    maximum, so checking the R maxima finds it (a -inf logit only rules its token out).
    `row_max`: the engine's faster `logits.max(dim=-1)`, None where it does not take them."""
    maxima = row_max(logits) if row_max is not None else None
    # plain greedy rows are done here: the first maximum
    best, tokens = logits.max(dim=-1) if maxima is None else maxima
    finite = torch.isfinite(best).tolist()
    tokens = tokens.tolist()
    want = [i for i, r in enumerate(rows) if r.logprobs is not None and finite[i]]
    raw = torch.log_softmax(logits[want].float(), dim=-1) if want else None  # (W, V)
    _apply_batched(logits, rows, finite)
    for i, r in enumerate(rows):
        if finite[i] and not r.plain:
            tokens[i] = r.pick(logits[i].clone())
    entries: list[TokenLogprob | None] = [None] * len(rows)
    if raw is not None:
        for w, i in enumerate(want):
            entries[i] = _entry(raw[w], tokens[i], rows[i].params.top_logprobs)
    return tokens, finite, entries


def _apply_batched(logits: torch.Tensor, rows: list[RowSampler], finite: list[bool]) -> None:
    """Each batched kind of processor over all its rows of the step, in one call (in place)."""
    groups: dict[type, tuple[list[LogitsProcessor], list[int]]] = {}
    for i, r in enumerate(rows):
        if finite[i]:
            for p in r.batched:
                procs, index = groups.setdefault(type(p), ([], []))
                procs.append(p)
                index.append(i)
    for kind, (procs, index) in groups.items():
        kind.apply_batch(logits, procs, index)


def _entry(logprobs: torch.Tensor, token: int, top: int) -> TokenLogprob:
    alts = []
    if top:
        values, ids = logprobs.topk(top)
        alts = [TokenLogprob(t, v) for t, v in zip(ids.tolist(), values.tolist(), strict=True)]
    return TokenLogprob(token, float(logprobs[token]), top_logprobs=alts)
