"""Compiled grammars and the per-row matchers that keep a row's tokens inside its spec.

`Grammars` belongs to one tokenizer: each distinct `OutputSpec` is compiled once (xgrammar)
and kept, from whichever thread asks first (the prep thread, so compiling overlaps the forward
pass; an engine or a Ray worker compiles what it has not seen). `GrammarProcessor` is a row's
matcher: it masks the row's logits to the tokens the grammar allows next, and advances on each
token the row keeps. It lives as long as the row (preemption and recompute keep it: its state
follows the row's kept tokens, which recompute does not change). The stop tokens are allowed
only where the grammar may end, so a row stops only with a complete value.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
import xgrammar as xgr

from jobrunner.engine.sampler import LogitsProcessor
from jobrunner.structured.spec import OutputSpec

# Compact JSON (", " and ": ", no free whitespace): a small model offered free whitespace can
# spend its whole token budget on newlines.
SEPARATORS = (", ", ": ")


class GrammarError(ValueError):
    """A spec that does not compile; `where` is its key path (e.g. body.response_format...)."""

    def __init__(self, message: str, where: str):
        super().__init__(message)
        self.where = where


@dataclass
class CompileStat:
    label: str
    seconds: float
    rows: int = 0  # rows that ran under it


class Grammars:
    def __init__(self, tokenizer, vocab_size: int, stop_token_ids: Iterable[int]) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size  # the model's logits width (may exceed len(tokenizer))
        self.stop_token_ids = sorted(stop_token_ids)
        self._lock = threading.Lock()
        self._compiler: xgr.GrammarCompiler | None = None
        self._compiled: dict[OutputSpec, xgr.CompiledGrammar | GrammarError] = {}
        self.stats: dict[OutputSpec, CompileStat] = {}
        self.tokenizer_seconds = 0.0  # the vocabulary scan, once
        self.mask_seconds = 0.0  # bitmask fill + apply, summed over steps
        self.mask_steps = 0
        self.mask_rows = 0

    def compile(self, spec: OutputSpec) -> xgr.CompiledGrammar:
        """The spec's grammar, compiled on first use. Raises GrammarError (cached too)."""
        with self._lock:
            got = self._compiled.get(spec)
            if got is None:
                compiler = self._compiler_for()
                t = time.perf_counter()
                got = self._compile(compiler, spec)
                self._compiled[spec] = got
                self.stats[spec] = CompileStat(spec.label, time.perf_counter() - t)
        if isinstance(got, GrammarError):
            raise GrammarError(str(got), spec.where)
        return got

    def processor(self, spec: OutputSpec) -> GrammarProcessor:
        """A fresh matcher for one row (compiling the spec if no one did yet)."""
        compiled = self.compile(spec)
        self.stats[spec].rows += 1
        return GrammarProcessor(xgr.GrammarMatcher(compiled), self)

    def apply(
        self, logits: torch.Tensor, processors: Sequence[GrammarProcessor], rows: Sequence[int]
    ) -> None:
        """`apply_masks`, timed: `mask_seconds` over `mask_steps` steps (the bench reads them)."""
        t = time.perf_counter()
        apply_masks(logits, processors, rows)
        self.mask_seconds += time.perf_counter() - t
        self.mask_steps += 1
        self.mask_rows += len(processors)

    @staticmethod
    def _compile(c: xgr.GrammarCompiler, spec: OutputSpec) -> xgr.CompiledGrammar | GrammarError:
        try:
            return c.compile_grammar(grammar_of(spec))
        except GrammarError as e:
            return e
        except (RuntimeError, ValueError) as e:  # xgrammar reports bad input as either
            return GrammarError(f"{spec.where} does not compile: {_first_line(e)}", spec.where)

    def _compiler_for(self) -> xgr.GrammarCompiler:
        if self._compiler is None:  # the tokenizer's vocabulary scan takes about a second
            t = time.perf_counter()
            info = xgr.TokenizerInfo.from_huggingface(
                self.tokenizer, vocab_size=self.vocab_size, stop_token_ids=self.stop_token_ids
            )
            self._compiler = xgr.GrammarCompiler(info, max_threads=2)
            self.tokenizer_seconds = time.perf_counter() - t
        return self._compiler


def grammar_of(spec: OutputSpec) -> xgr.Grammar:
    """The spec as an xgrammar grammar, before any tokenizer: what `Grammars` compiles, and
    what a job's own spec is checked by before the model loads. Raises GrammarError."""
    try:
        if spec.kind == "json_schema":
            return xgr.Grammar.from_json_schema(
                spec.source, any_whitespace=False, separators=SEPARATORS, strict_mode=True
            )
        if spec.kind == "json_object":
            return xgr.Grammar.from_json_schema(
                '{"type": "object"}', any_whitespace=False, separators=SEPARATORS
            )
        if spec.kind == "regex":
            return xgr.Grammar.from_regex(spec.source)
        labels = json.loads(spec.source)
        return xgr.Grammar.from_ebnf("root ::= " + " | ".join(_ebnf_string(x) for x in labels))
    except (RuntimeError, ValueError) as e:  # xgrammar reports bad input as either
        raise GrammarError(f"{spec.where} does not compile: {_first_line(e)}", spec.where) from e


class GrammarProcessor(LogitsProcessor):
    """One row's matcher, a link of its sampler's chain (engine/sampler.py). It allows no
    drafts: a draft token is never checked against the grammar, so constrained rows decode one
    token a step. Batched: a step's constrained rows are masked by one `apply_batch`."""

    allows_drafts = False
    batched = True

    def __init__(self, matcher: xgr.GrammarMatcher, grammars: Grammars | None = None) -> None:
        self.matcher = matcher
        self.grammars = grammars  # whose timing counters a batch adds to
        self.rejected = False  # a kept token the grammar refused (a bug elsewhere, not the row)

    def __call__(self, logits: torch.Tensor, row=None) -> torch.Tensor:
        """logits: (V,) or (1, V); masked in place to the tokens the grammar allows next."""
        apply_masks(logits.view(1, -1), [self])
        return logits

    @classmethod
    def apply_batch(cls, logits, processors, rows) -> None:
        """Mask the step's constrained rows in one pass (timed by their `Grammars`)."""
        owner = processors[0].grammars
        if owner is not None:
            owner.apply(logits, processors, rows)
        else:
            apply_masks(logits, processors, rows)

    @property
    def structure(self) -> str:
        """The Result's mark: "complete", or "incomplete" when the row ended mid-value."""
        return "complete" if self.complete else "incomplete"

    def accept(self, tokens: Sequence[int]) -> None:
        for t in tokens:
            if not self.matcher.is_terminated() and not self.matcher.accept_token(t):
                self.rejected = True

    @property
    def complete(self) -> bool:
        """The row's output is a whole value of the grammar (its stop token was accepted, or
        nothing may follow)."""
        return self.matcher.is_terminated() or self.matcher.is_completed()


def apply_masks(
    logits: torch.Tensor, processors: Sequence[GrammarProcessor], rows: Sequence[int] | None = None
) -> None:
    """Mask logits (R, V) in place: processors[k] constrains row rows[k] (default: row k). One
    bitmask fill over the constrained rows only (threaded inside xgrammar) and one masking pass
    over them; unconstrained rows are not touched."""
    index = list(range(len(processors))) if rows is None else list(rows)
    bitmask = _bitmask(logits.shape[0], logits.shape[-1])
    matchers = [p.matcher for p in processors]
    if len(matchers) == 1:
        matchers[0].fill_next_token_bitmask(bitmask, index[0])
    else:
        _batch_matcher().batch_fill_next_token_bitmask(matchers, bitmask, index)
    mask = bitmask[: logits.shape[0]]
    if logits.device.type != "cpu":
        mask = mask.to(logits.device, non_blocking=True)
    xgr.apply_token_bitmask_inplace(logits, mask, vocab_size=logits.shape[-1], indices=index)


_LOCAL = threading.local()  # per thread: a reused bitmask buffer and a batch matcher


def _bitmask(n: int, vocab_size: int) -> torch.Tensor:
    """A reused (>= n, ceil(V/32)) int32 CPU buffer."""
    buf = getattr(_LOCAL, "bitmask", None)
    if buf is None or buf.shape[0] < n or buf.shape[1] * 32 < vocab_size:
        buf = _LOCAL.bitmask = xgr.allocate_token_bitmask(max(n, 64), vocab_size)
    return buf


def _batch_matcher() -> xgr.BatchGrammarMatcher:
    m = getattr(_LOCAL, "batch", None)
    if m is None:
        m = _LOCAL.batch = xgr.BatchGrammarMatcher(max_threads=torch.get_num_threads())
    return m


def _ebnf_string(label: str) -> str:
    """A label as an EBNF string literal (JSON escapes are xgrammar's escapes)."""
    return json.dumps(label, ensure_ascii=False)


def _first_line(e: BaseException) -> str:
    """xgrammar's message without its C++ source prefix (`[12:00:00] /project/cpp/x.cc:12: `)."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return re.sub(r"^\[[\d:]+\] \S+:\d+: ", "", text)
