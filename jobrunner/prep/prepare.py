"""Turn raw rows into Requests: ids, prompt rendering, tokenization and per-row validation.

Every row becomes exactly one Request or one RowError (with file, row/line and field), so a bad
row never stops the job. Tokenization is batched: the fast tokenizer works on a list at once.
"""

from __future__ import annotations

import functools
import hashlib
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any
from uuid import UUID

from jobrunner.config import JobConfig
from jobrunner.io.compressed import plain_name
from jobrunner.io.identity import input_root, relative_name
from jobrunner.io.readers import Item, RawRow
from jobrunner.prep.render import (
    BYTES,
    Framed,
    PromptRenderer,
    RenderError,
    Segmented,
    binary_text,
)
from jobrunner.prep.tokens import SegmentEncoder, TextEncoder
from jobrunner.structured.spec import SpecError, generation_spec, response_format_spec
from jobrunner.types import Request, RowError, RowRef, SamplingParams, kind_of

RESULT_COLUMNS = {
    "id",
    "completion",
    "finish_reason",
    "prompt_tokens",
    "cached_tokens",
    "completion_tokens",
    "cost_usd",
    "model",
    "structure",
}


def derived_id(ref: RowRef, root: Path | None = None) -> str:
    """`file:row`, the file named relative to the input root (`2024/part.jsonl:3`), so files of
    one name in different folders give different ids; without a root, by its base name."""
    return f"{derived_name(ref.file, root)}:{ref.row}"


def _id_kind(v: Any) -> str:
    """What an id of another type is, with the likely cause for a float: pandas writes an
    integer column holding a missing value as float64 (1 becomes 1.0)."""
    if isinstance(v, float):
        return (
            f"the float {v!r} (pandas stores integers with a missing value as float64: write"
            " the ids as pandas' Int64 or as strings)"
        )
    return f"{kind_of(v)} {str(v)[:40]!r}"


@functools.lru_cache(maxsize=4096)
def derived_name(file: str, root: Path | str | None) -> str:
    """How derived ids name `file`: as messages do (place_name), a compressed file as the file
    it holds (`a.jsonl.gz` as `a.jsonl`: its rows keep the ids they had before compressing)."""
    return plain_name(place_name(file, root))


@functools.lru_cache(maxsize=4096)
def place_name(file: str, root: Path | str | None) -> str:
    """How messages name `file`: relative to the input root, else by its base name."""
    name = relative_name(file, root) if root is not None else file
    return name if not os.path.isabs(name) else os.path.basename(file)  # outside the root


def row_seed(seed: int, row_id: str) -> int:
    """A per-row seed: the same row and job seed sample the same text in any batch."""
    digest = hashlib.blake2b(_seed_prefix(seed) + row_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


@functools.lru_cache(maxsize=64)
def _seed_prefix(seed: int) -> bytes:
    return f"{seed}\x00".encode()


def sampling_params(cfg: JobConfig) -> SamplingParams:
    g = cfg.generation
    return SamplingParams(
        max_new_tokens=g.max_new_tokens,
        temperature=g.temperature,
        top_p=g.top_p,
        top_k=g.top_k,
        seed=g.seed,
        stop=tuple(g.stop),
        ignore_eos=g.ignore_eos,
        min_p=g.min_p,
        presence_penalty=g.presence_penalty,
        frequency_penalty=g.frequency_penalty,
        repetition_penalty=g.repetition_penalty,
        logit_bias=tuple(sorted(g.logit_bias.items())),
        min_tokens=g.min_tokens,
        stop_token_ids=tuple(g.stop_token_ids),
        n=g.n,
        logprobs=g.logprobs or g.top_logprobs > 0,
        top_logprobs=g.top_logprobs,
        structured=generation_spec(g.response_format, g.choice, g.regex),
    )


class Preparer:
    """Stateful per job: remembers, per input file, whether it carries an id column."""

    def __init__(self, cfg: JobConfig, tokenizer: Any) -> None:
        if tokenizer is not None:  # (the id scans have none) the job's own ids: 78, not each row
            cfg.check_token_ids(len(tokenizer))
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.renderer = PromptRenderer(cfg.input, tokenizer)
        self.sampling = sampling_params(cfg)
        self._file_has_ids: dict[str, bool] = {}
        self._root = input_root(cfg.input.path)  # derived ids name files relative to it

    def prepare(self, items: Iterable[Item], batch_rows: int = 256) -> Iterator[Request | RowError]:
        """Requests and RowErrors, in input order."""
        batch: list[Item] = []
        for item in items:
            batch.append(item)
            if len(batch) >= batch_rows:
                yield from self.prepare_batch(batch)
                batch = []
        if batch:
            yield from self.prepare_batch(batch)

    def prepare_batch(self, items: list[Item]) -> list[Request | RowError]:
        out: list[Request | RowError | tuple[str, RawRow, str]] = [self._render(i) for i in items]
        todo = [k for k, o in enumerate(out) if isinstance(o, tuple)]
        encoded = self._tokenize([out[k][2] for k in todo])
        for k, ids in zip(todo, encoded, strict=True):
            out[k] = self._to_request(*out[k], ids)
        return out  # type: ignore[return-value]

    def _to_request(self, row_id: str, raw: RawRow, text: str, ids) -> Request | RowError:
        if isinstance(ids, BaseException):
            return row_failure(raw, row_id, "tokenize_failed", "cannot tokenize the prompt", ids)
        ids = ids if isinstance(ids, list) else list(ids)
        return self._guarded(raw, row_id, self._request, row_id, raw, text, ids)

    def _tokenize(self, texts: list[str]) -> list[list[int] | BaseException]:
        """Token ids per text, batched; when the batch fails, text by text, so one text the
        tokenizer refuses fails its own row only."""
        if not texts:
            return []
        try:
            return self._encode(texts)
        except Exception:
            out: list[list[int] | BaseException] = []
            for t in texts:
                try:
                    out.append(self._encode([t])[0])
                except Exception as e:  # this row's text only
                    out.append(e)
            return out

    def _guarded(
        self, raw: RawRow, row_id: str | None, step: Callable[..., Any], *args: Any
    ) -> Any:
        """A per-row step, `step(*args)`; any failure becomes that row's error (never the job's)."""
        try:
            return step(*args)
        except RenderError as e:
            return RowError(e.code, f"{raw.source}: {e}", raw.source, row_id, e.field)
        except (RecursionError, MemoryError) as e:
            return row_failure(raw, row_id, "too_complex", "the row is nested too deeply", e)
        except Exception as e:  # a value no step expected: the row fails, the job goes on
            return row_failure(raw, row_id, "bad_row", "cannot prepare the row", e)

    def _encode(self, texts: list[str]) -> list[list[int]]:
        """Token ids per text; framed chat prompts tokenize only their user text (render.py)."""
        framed = [k for k, t in enumerate(texts) if isinstance(t, Framed)]
        frame = self.renderer.frame_token_ids if framed else None
        framed = framed if frame else []
        out: list[list[int]] = [[] for _ in texts]
        if framed:
            pre, post = frame
            contents = [texts[k].content for k in framed]
            for k, ids in zip(framed, self.encoder.encode(contents, False), strict=True):
                out[k] = [*pre, *ids, *post]
        taken = set(framed)
        rest = [k for k in range(len(texts)) if k not in taken]
        for k, ids in zip(rest, self.encode_texts([texts[k] for k in rest]), strict=True):
            out[k] = ids
        return out

    def encode_texts(self, texts: list[str], special: bool | None = None) -> list[list[int]]:
        """Token ids per text (`special`: add the tokenizer's special tokens; by default as the
        renderer says); chat text whose contents hold special-token text (`Segmented`) is
        tokenized piece by piece, so that text stays text."""
        special = self.renderer.adds_special_tokens if special is None else special
        parts = [k for k, t in enumerate(texts) if isinstance(t, Segmented)]
        whole = [k for k, t in enumerate(texts) if not isinstance(t, Segmented)]
        out: list[list[int]] = [[] for _ in texts]
        if parts:
            encoded = self.segments.encode([texts[k].pieces for k in parts])
            for k, ids in zip(parts, encoded, strict=True):
                out[k] = ids
        if whole:
            encoded = self.encoder.encode([texts[k] for k in whole], special)
            for k, ids in zip(whole, encoded, strict=True):
                out[k] = ids
        return out

    @functools.cached_property
    def encoder(self) -> TextEncoder:
        """The tokenizer's batch call, or its cached byte-level form (prep/tokens.py)."""
        return TextEncoder(self.tokenizer)

    @functools.cached_property
    def segments(self) -> SegmentEncoder:
        """Chat text whose contents hold special-token text, tokenized whole (prep/tokens.py)."""
        return SegmentEncoder(self.tokenizer)

    # ------------------------------------------------------------------ per row

    def _render(self, item: Item) -> RowError | tuple[str, RawRow, str]:
        return self._per_row(item, self._render_values)

    def _render_values(self, raw: RawRow) -> Any:
        return self.renderer.render(raw.values)

    def _per_row(
        self, item: Item, render: Callable[[RawRow], Any]
    ) -> RowError | tuple[str, RawRow, Any]:
        """(id, row, render(row)), or the RowError that stopped the row: a parse error, a bad id,
        or a RenderError (named by row and field)."""
        if isinstance(item, RowError):
            return item
        row_id = self._guarded(item, None, self.row_id, item)
        if isinstance(row_id, RowError):
            return row_id
        text = self._guarded(item, row_id, self._rendered, render, item)
        return text if isinstance(text, RowError) else (row_id, item, text)

    def _rendered(self, render: Callable[[RawRow], Any], item: RawRow) -> Any:
        return self._bounded(render(item))

    def _bounded(self, text: Any) -> Any:
        """The rendered prompt, refused before tokenizing when over input.max_prompt_chars."""
        limit = self.cfg.input.max_prompt_chars
        if isinstance(text, str) and len(text) > limit:
            raise RenderError(
                "too_long",
                f"the prompt has {len(text):,} characters, over input.max_prompt_chars"
                f" {limit:,} (raise it if such prompts are meant)",
                self.cfg.input.prompt.column,
            )
        return text

    def result_ids(self, row_id: str, raw: RawRow) -> list[str]:
        """The ids of the results (or error) an input row can end as: its own id, except where
        one row becomes several (an embeddings line with several inputs)."""
        return [row_id]

    def file_ids(self, files: Iterable[str]) -> dict[str, bool]:
        """Whether each of `files` seen so far carries ids (decided by its first row)."""
        return {f: self._file_has_ids[f] for f in files if f in self._file_has_ids}

    def adopt_file_ids(self, has_ids: dict[str, bool]) -> None:
        """Decide ids as another preparer did (a Ray block that starts mid-file)."""
        self._file_has_ids.update(has_ids)

    def row_id(self, raw: RawRow) -> str | RowError:
        col = self.cfg.input.id_column
        has_ids = self._file_has_ids.setdefault(raw.source.file, bool(col) and col in raw.values)
        if not has_ids:
            return derived_id(raw.source, self._root)
        v = raw.values.get(col)
        if v is None:
            return RowError(
                "missing_id",
                f"{raw.source}: the id column {col!r} is null or missing",
                raw.source,
                None,
                col,
            )
        if isinstance(v, UUID):  # Parquet's UUID type (DuckDB, Iceberg): its canonical text
            return str(v)
        if isinstance(v, BYTES):  # Hive's and Impala's strings: the UTF-8 text they hold
            try:
                v = binary_text(v, f"id {col!r}", col)
            except RenderError as e:
                return RowError(e.code, f"{raw.source}: {e}", raw.source, None, col)
        if isinstance(v, bool) or not isinstance(v, (str, int)):
            return RowError(
                "bad_type",
                f"{raw.source}: id {col!r} must be a string or integer, got {_id_kind(v)}",
                raw.source,
                None,
                col,
            )
        if isinstance(v, str) and not v.strip():
            return RowError(
                "missing_id", f"{raw.source}: the id {col!r} is empty", raw.source, None, col
            )
        return str(v)

    def _request(
        self,
        row_id: str,
        raw: RawRow,
        text: str,
        ids: list[int],
        sampling: SamplingParams | None = None,
        prompt_field: str | None = None,
    ) -> Request | RowError:
        """`prompt_field` names the prompt in a too-long error (default: the prompt column)."""
        limit = self.cfg.model.max_model_len - 1  # room for at least one new token
        if len(ids) > limit:
            policy = self.cfg.input.on_too_long
            if policy == "error":
                return RowError(
                    "too_long",
                    f"{raw.source}: the prompt has {len(ids)} tokens;"
                    f" model.max_model_len {limit + 1} leaves no room to generate (raise it,"
                    " up to the model's own context length, or set input.on_too_long to"
                    " truncate_left or truncate_right to cut the prompt)",
                    raw.source,
                    row_id,
                    prompt_field or self.cfg.input.prompt.column,
                )
            ids = ids[-limit:] if policy == "truncate_left" else ids[:limit]
        room = self.cfg.model.max_model_len - len(ids)
        sampling = sampling or self.sampling
        column = self.cfg.input.response_format_column
        if column and raw.values.get(column) is not None:
            try:
                spec = response_format_spec(raw.values[column], column)
            except SpecError as e:
                return RowError(e.code, f"{raw.source}: {e}", raw.source, row_id, e.field)
            sampling = replace(sampling, structured=spec)
        if bad := self._unknown_tokens(sampling):
            return RowError(
                "bad_sampling",
                f"{raw.source}: {bad[0]} names token ids outside the model's vocabulary"
                f" (size {len(self.tokenizer)}): {bad[1]}",
                raw.source,
                row_id,
                bad[0],
            )
        if sampling.max_new_tokens > room:
            sampling = replace(sampling, max_new_tokens=room)
        return Request(
            row_id,
            ids,
            sampling,
            raw.source,
            text,
            self._priority(raw),
            row_seed(self.sampling.seed, row_id),
            self._columns(raw),
        )

    def _unknown_tokens(self, s: SamplingParams) -> tuple[str, list[int]] | None:
        """(the field, its token ids the model does not have), or None: a row's own (an OpenAI
        batch line's), as the job's were checked when the preparer was made."""
        if not s.logit_bias and not s.stop_token_ids:
            return None
        vocab = len(self.tokenizer)
        for name, ids in (
            ("logit_bias", [t for t, _ in s.logit_bias]),
            ("stop_token_ids", list(s.stop_token_ids)),
        ):
            if bad := [t for t in ids if t >= vocab]:
                return name, bad
        return None

    def _priority(self, raw: RawRow) -> int:
        col = self.cfg.input.priority_column
        v = raw.values.get(col) if col else None
        return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0

    def _columns(self, raw: RawRow) -> dict[str, Any]:
        if not self.cfg.output.keep_input_columns:
            return {}
        cols = raw.values.copy() if raw.exact is None else {**raw.values, **raw.exact}
        # A string id is the `id` column already; another type (an integer) keeps its column.
        if isinstance(cols.get(self.cfg.input.id_column), str):
            del cols[self.cfg.input.id_column]
        if RESULT_COLUMNS.isdisjoint(cols):  # the usual row: no renaming, no per-key loop
            return cols
        return renamed_input_columns(cols)


def renamed_input_columns(cols: dict[str, Any]) -> dict[str, Any]:
    """The input's columns beside the result's: one named like a result column becomes
    `input_<name>`, prefixed again while that name is another input column's (no value lost)."""
    out: dict[str, Any] = {}
    for k, v in cols.items():
        if k in RESULT_COLUMNS:
            k = f"input_{k}"
            while k in cols or k in out:
                k = f"input_{k}"
        out[k] = v
    return out


def row_failure(
    raw: RawRow, row_id: str | None, code: str, what: str, e: BaseException
) -> RowError:
    detail = " ".join(str(e).split())[:300] or type(e).__name__
    return RowError(code, f"{raw.source}: {what}: {type(e).__name__}: {detail}", raw.source, row_id)
