"""What crosses stage boundaries: `Request` in, `Result` with `Usage` out. No torch here."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class FinishReason(str, enum.Enum):
    STOP = "stop"  # EOS or a stop string
    LENGTH = "length"  # max_new_tokens (or the model's context) reached
    ERROR = "error"  # the row failed; Result.error says why


@dataclass(frozen=True)
class SamplingParams:
    """Per-request generation parameters (from `generation:` or an OpenAI batch body)."""

    max_new_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


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

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)


@dataclass
class Usage:
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens served from the prefix cache (not computed)
    completion_tokens: int = 0
    cost_usd: float = 0.0

    @property
    def computed_prompt_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens


@dataclass
class Result:
    """A finished row. `error_code`/`error` are set only when finish_reason is ERROR."""

    id: str
    completion: str
    finish_reason: FinishReason
    usage: Usage
    token_ids: list[int] = field(default_factory=list)
    source: RowRef | None = None
    columns: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    error_code: str | None = None
    error: str | None = None
    shared_with: int = 1  # >1 when exact duplicates shared one computation (cost is split)

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
