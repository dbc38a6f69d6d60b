"""What crosses stage boundaries: `Request` in, `Result` with `Usage` out. No torch here."""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jobrunner.structured.spec import OutputSpec


class FinishReason(str, enum.Enum):
    STOP = "stop"  # EOS or a stop string
    LENGTH = "length"  # max_new_tokens (or the model's context) reached
    ERROR = "error"  # the row failed; Result.error says why


@dataclass(frozen=True)
class SamplingParams:
    """Per-request generation parameters (from `generation:` or an OpenAI batch body).

    Hashable and compared by value: the dedup key and the static engine's batch groups read
    every field, so a new field distinguishes rows by itself (keep values immutable: tuples).
    """

    max_new_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    min_p: float = 0.0  # drop tokens below min_p x the top token's probability
    presence_penalty: float = 0.0  # OpenAI: minus this once a token appeared in the output
    frequency_penalty: float = 0.0  # OpenAI: minus this x the token's count in the output
    repetition_penalty: float = 1.0  # HF/vLLM: divide (or multiply, if < 0) seen tokens' logits
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias added to its logit), sorted
    min_tokens: int = 0  # EOS and stop_token_ids are banned until this many tokens
    stop_token_ids: tuple[int, ...] = ()  # tokens that end the row like EOS (kept in token_ids)
    n: int = 1  # samples per row, each a Choice of the row's Result
    logprobs: bool = False  # per generated token: its log-probability (raw model distribution)
    top_logprobs: int = 0  # ... and the most likely alternatives (0..20)
    structured: OutputSpec | None = None  # the grammar the output must match (structured/)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def plain_greedy(self) -> bool:
        """Greedy with no logits processor and no logprobs: one argmax is the whole sampler."""
        return (
            self.greedy
            and not self.logprobs
            and not self.min_tokens
            and not self.logit_bias
            and self.repetition_penalty == 1.0
            and not self.presence_penalty
            and not self.frequency_penalty
            and self.structured is None
        )

    def end_ids(self, eos: Iterable[int]) -> frozenset[int]:
        """The tokens that end a row: EOS (unless ignore_eos) and its stop_token_ids."""
        return frozenset(() if self.ignore_eos else eos) | frozenset(self.stop_token_ids)


@dataclass(frozen=True)
class RowRef:
    """Where a row came from, for error messages: file and 0-based row (or 1-based line)."""

    file: str
    row: int  # 0-based row index within the file
    line: int | None = None  # 1-based line number for line formats (jsonl, csv, openai-batch)

    def __str__(self) -> str:
        where = f"line {self.line}" if self.line is not None else f"row {self.row}"
        return f"{self.file}:{where}"


@dataclass
class Request:
    """One unit of generation work, ready for an engine.

    `seq_seed` makes sampling reproducible per row whatever its batch neighbours: engines seed
    a per-row generator from it (derived from generation.seed and the row id).
    """

    id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams
    source: RowRef | None = None
    prompt: str = ""
    priority: int = 0
    seq_seed: int = 0
    columns: dict[str, Any] = field(default_factory=dict)  # input columns kept in the output
    meta: dict[str, Any] = field(default_factory=dict)  # format-specific extras (e.g. openai)
    sample_index: int = 0  # which of the row's n samples this is (engines run one per Request)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)


@dataclass
class Usage:
    """A row's tokens, the work the engine did for it, and what that cost.

    The work fields are what telemetry.cost prices a row by: each engine step's measured time
    is shared by the rows in the step in proportion to the tokens each computed in it
    (`device_seconds`), and the time outside steps (load, start-up, idle) by `work_tokens`.
    Duplicates that shared one computation carry the leader's work and split it
    (`Result.shared_with`).
    Token counts are summed over a row's choices (each sample's tokens count, the prompt once).
    """

    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens served from the prefix cache (not computed)
    completion_tokens: int = 0
    cost_usd: float = 0.0
    prefill_tokens: int = 0  # prompt tokens put through the model (again after a preemption)
    decode_tokens: int = 0  # tokens put through the model while generating (drafts included)
    device_seconds: float = 0.0  # this row's share of the measured engine steps it was in
    first_token_seconds: float | None = None  # from entering the engine to its first token
    decode_seconds: float | None = None  # from its first token to its last

    @property
    def work_tokens(self) -> int:
        """Every token the engine computed for this row."""
        return self.prefill_tokens + self.decode_tokens

    def add_step(self, tokens: int, decoding: bool, seconds: float) -> None:
        """One engine step computed `tokens` for this row, taking `seconds` of its time."""
        if decoding:
            self.decode_tokens += tokens
        else:
            self.prefill_tokens += tokens
        self.device_seconds += seconds

    @property
    def computed_prompt_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens


@dataclass
class TokenLogprob:
    """One generated token's log-probability (log_softmax of the raw model logits) and, in
    `top_logprobs`, the most likely tokens at that position (their own top_logprobs empty).
    `token` is the token's text alone; `bytes` its UTF-8 bytes (OpenAI's fields)."""

    token_id: int
    logprob: float
    token: str = ""
    bytes: list[int] | None = None
    top_logprobs: list[TokenLogprob] = field(default_factory=list)


@dataclass
class Choice:
    """One output of a row: a sample's text (stop strings applied, not included), its token ids
    (including the EOS or stop token that ended it), why it ended, and per-token logprobs when
    asked (one per token id)."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: FinishReason
    logprobs: list[TokenLogprob] | None = None
    # constrained rows: "complete", or "incomplete" when the sample ended (max_new_tokens, a
    # stop string) before its value did; None for unconstrained rows
    structure: str | None = None


@dataclass
class Result:
    """A finished row: its choices (n of them; none for a failed row or an embedding).
    `error_code`/`error` are set only for a failed row (finish_reason ERROR)."""

    id: str
    choices: list[Choice]
    usage: Usage
    source: RowRef | None = None
    columns: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    error_code: str | None = None
    error: str | None = None
    shared_with: int = 1  # >1 when exact duplicates shared one computation (cost is split)
    embedding: list[float] | None = None  # an embed row's vector (task: embed); no choices

    @property
    def completion(self) -> str:
        return self.choices[0].text if self.choices else ""

    @property
    def finish_reason(self) -> FinishReason:
        if self.error_code is not None:
            return FinishReason.ERROR
        return self.choices[0].finish_reason if self.choices else FinishReason.STOP

    @property
    def token_ids(self) -> list[int]:
        return self.choices[0].token_ids if self.choices else []

    @property
    def structure(self) -> str | None:
        return self.choices[0].structure if self.choices else None

    @property
    def ok(self) -> bool:
        return self.finish_reason is not FinishReason.ERROR


@dataclass
class RowError:
    """A row rejected before generation (bad input) or failed during it."""

    code: str
    message: str
    source: RowRef | None = None
    id: str | None = None
    field: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "file": self.source.file if self.source else None,
            "row": self.source.row if self.source else None,
            "line": self.source.line if self.source else None,
            "field": self.field,
            "code": self.code,
            "message": self.message,
        }


def kind_of(value: Any) -> str:
    """A value's kind as a user's data names it (JSON's words), for messages: "null", "a
    number", "an array"; a Parquet value of another type by its Python type."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true or false"
    for types, word in (
        ((int, float), "a number"),
        (str, "a string"),
        ((list, tuple), "an array"),
        (dict, "an object"),
    ):
        if isinstance(value, types):
            return word
    return type(value).__name__
