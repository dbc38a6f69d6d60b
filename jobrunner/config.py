"""The job file: typed, validated at the edge. `load_job` is the only YAML reader.

Errors name the file, the line and the key path, and say what is allowed:
`job.yaml:7 generation.temperature: must be >= 0`.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from jobrunner.errors import ConfigError, JobError
from jobrunner.io.compressed import CODECS, full_suffix, open_input
from jobrunner.io.readers import ReadOptions, find_files
from jobrunner.io.store_errors import from_store_error
from jobrunner.structured.spec import SpecError, generation_spec


class _Strict(BaseModel):
    # strict: a value of the wrong YAML type is refused, never coerced (`true` is not 1, "128"
    # is not 128, 2.0 is not 2); an integer stays a valid float (`temperature: 1`)
    model_config = ConfigDict(extra="forbid", validate_assignment=True, strict=True)


def _token_id_text(v: Any) -> Any:
    """A logit_bias key may be an integer's text, as in OpenAI's JSON bodies ({"50256": -100})."""
    return int(v) if isinstance(v, str) and re.fullmatch(r"-?[0-9]+", v) else v


TokenIdKey = Annotated[int, BeforeValidator(_token_id_text)]


class ModelConfig(_Strict):
    source: str = "smollm2-135m-instruct"
    revision: str | None = None
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    quantization: Literal["none", "int8", "int4", "fp8"] = "none"
    kv_cache_dtype: Literal["auto", "float16", "bfloat16", "int8", "fp8"] = "auto"
    max_model_len: int = Field(2048, ge=16)
    trust_remote_code: bool = False
    allow_pickle: bool = False
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    keep_in_16bit: list[str] = Field(default_factory=list)
    quality_check: int = Field(0, ge=0)
    quality_min_agreement: float | None = Field(None, ge=0.0, le=1.0)
    # embed jobs: auto = the model's sentence-transformers files, else last (decoder) / mean
    pooling: Literal["auto", "mean", "cls", "last"] = "auto"

    @model_validator(mode="after")
    def _gate_has_rows(self) -> ModelConfig:
        if self.quality_min_agreement is not None and not self.quality_check:
            raise ValueError(
                "quality_min_agreement needs quality_check: N, the number of sampled"
                " rows to measure the agreement on (e.g. 16)"
            )
        return self


class PromptConfig(_Strict):
    """Exactly one of column, messages_column, template."""

    column: str | None = None
    messages_column: str | None = None
    template: str | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> PromptConfig:
        given = [k for k in ("column", "messages_column", "template") if getattr(self, k)]
        if len(given) != 1:
            raise ValueError(
                "give exactly one of column, messages_column, template"
                f" (got {', '.join(given) or 'none'})"
            )
        return self


NOT_SEPARATORS = '"\n\r'  # a quote opens a field; a line end ends a row
TAB_SPELLINGS = ("\\t", "tab")  # a tab as written where YAML keeps it as text


def _separator_problem(v: str) -> str | None:
    """What is wrong with `v` as input.delimiter: one character, not a quote or line end."""
    if v.lower() in TAB_SPELLINGS:
        return (
            f'must be one character, got {v} ({len(v)} characters): for a tab, write "\\t" in'
            " double quotes (YAML reads \\t as a tab only there)"
        )
    if len(v) != 1:
        return f'must be one character (such as ",", ";", "|" or "\\t"), got {v!r}'
    if v in NOT_SEPARATORS:
        return f"cannot be a quote, a newline or a carriage return, got {v!r}"
    return None


class InputConfig(_Strict):
    path: str = "data/samples/prompts.parquet"
    format: Literal["auto", "parquet", "jsonl", "csv", "openai-batch"] = "auto"
    # CSV: the separator of every CSV file; null: a tab for .tsv and .tab, else the header's
    delimiter: str | None = None
    id_column: str | None = "id"
    prompt: PromptConfig = Field(default_factory=lambda: PromptConfig(column="prompt"))
    system_prompt: str | None = None
    use_chat_template: bool = True  # text prompts go through the model's chat template
    # special-token text (`<|im_end|>`) in a chat message's content: "text" tokenizes it as the
    # characters (OpenAI's API does; a row cannot forge a turn), "parse" as control tokens (HF
    # apply_chat_template + tokenize, vLLM); a prompt without chat template is always parsed
    special_tokens: Literal["text", "parse"] = "text"
    priority_column: str | None = None
    on_too_long: Literal["error", "truncate_left", "truncate_right"] = "error"
    max_error_rate: float = Field(0.05, ge=0.0, le=1.0)
    batch_rows: int = Field(1024, ge=1)  # rows per streamed read batch
    # a longer rendered prompt is a row error before tokenizing (bounds one row's memory)
    max_prompt_chars: int = Field(1_000_000, ge=1)
    # structured outputs (grammar): a column holding the row's response_format (object or JSON)
    response_format_column: str | None = None
    # Hive partition folders below input.path (`country=de/`) as string columns (io/partitions.py)
    partition_columns: bool = True

    @field_validator("delimiter")
    @classmethod
    def _one_separator(cls, v: str | None, info: ValidationInfo) -> str | None:
        fmt = info.data.get("format", "auto")
        if v is not None and fmt not in ("auto", "csv"):
            raise ValueError(
                f"applies to CSV input only, and input.format is {fmt}; remove input.delimiter"
            )
        if v is not None and (problem := _separator_problem(v)):
            raise ValueError(problem)
        return v

    @property
    def read_options(self) -> ReadOptions:
        return ReadOptions(delimiter=self.delimiter)


class GenerationConfig(_Strict):
    max_new_tokens: int = Field(128, ge=1)
    temperature: float = Field(0.0, ge=0.0, allow_inf_nan=False)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0)
    seed: int = 0
    stop: list[Annotated[str, Field(min_length=1)]] = Field(default_factory=list)
    ignore_eos: bool = False
    # the rest of the sampling surface (engine/sampler.py); OpenAI batch bodies override per line
    min_p: float = Field(0.0, ge=0.0, le=1.0)  # drop tokens below min_p x the top probability
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)  # OpenAI: once a token is in the output
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)  # OpenAI: per occurrence in the output
    repetition_penalty: float = Field(
        1.0, gt=0.0, allow_inf_nan=False
    )  # HF/vLLM: over prompt and output tokens
    # token id (an integer, or its text as in OpenAI's bodies) -> bias in [-100, 100]
    logit_bias: dict[TokenIdKey, float] = Field(default_factory=dict)
    min_tokens: int = Field(0, ge=0)  # EOS and stop_token_ids are banned before this many tokens
    stop_token_ids: list[Annotated[int, Field(ge=0)]] = Field(
        default_factory=list
    )  # more tokens that end a row, as EOS
    n: int = Field(1, ge=1, le=128)  # samples per row: the result's choices
    logprobs: bool = False  # each generated token's log-probability (the raw model distribution)
    top_logprobs: int = Field(
        0, ge=0, le=20
    )  # ... and its most likely alternatives (implies logprobs)
    # structured outputs (grammar; at most one of the three; docs/DESIGN.md)
    response_format: dict[str, Any] | None = None  # {type: json_schema, json_schema: {...}} ...
    choice: list[str] | None = None  # the output is exactly one of these labels
    regex: str | None = None  # the output matches this regular expression

    @model_validator(mode="after")
    def _bias_in_range(self) -> GenerationConfig:
        bad = {t: b for t, b in self.logit_bias.items() if not -100.0 <= b <= 100.0 or t < 0}
        if bad:
            raise ValueError(
                f"logit_bias maps token ids (>= 0) to biases in [-100, 100]; got {bad}"
            )
        return self

    @model_validator(mode="after")
    def _one_structure(self) -> GenerationConfig:
        try:
            generation_spec(self.response_format, self.choice, self.regex)
        except SpecError as e:
            raise ValueError(str(e)) from e
        return self


class OutputConfig(_Strict):
    path: str = "out/job"  # the run directory: empty, or one a run of this job made
    format: Literal["parquet", "jsonl", "openai-batch"] = "parquet"
    keep_input_columns: bool = True
    shard_rows: int = Field(1000, ge=1)  # commit a shard at least every N finished rows
    shard_seconds: float = Field(30.0, gt=0)  # ... or every T seconds

    @field_validator("path")
    @classmethod
    def _path_given(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must name the run directory (e.g. out/my-job), got an empty path")
        return v


# engine.max_batch_tokens unset: a CPU's steps keep their activations nearer the cores (an AMX
# Xeon, bfloat16: 4,096-token steps ran 4% faster in bench (b), 3% in a 512-row job, embeddings
# the same: docs/performance.md); a GPU's wide steps fill it
CPU_BATCH_TOKENS, GPU_BATCH_TOKENS = 4096, 8192


class EngineConfig(_Strict):
    kind: Literal["auto", "paged", "static"] = "paged"
    max_num_seqs: int = Field(256, ge=1)
    max_batch_tokens: int | None = Field(None, ge=16)  # null: batch_tokens() per device
    prefix_caching: bool = True
    block_size: int = Field(16, ge=1)
    memory_fraction: float = Field(0.9, gt=0.0, le=1.0)
    kv_cache_bytes: int | None = Field(None, ge=1)  # explicit KV-cache size, overrides fraction
    order_window: int = Field(4096, ge=1)  # rows reordered together (shared heads, lengths)
    num_threads: int | None = Field(None, ge=1)
    cuda_graphs: bool = True  # CUDA: decode steps replay captured graphs (engine/paged)
    # greedy rows: up to this many draft tokens a step from n-gram lookup (sched/draft.py)
    speculative_tokens: int = Field(0, ge=0, le=16)

    def batch_tokens(self, device_kind: str) -> int:
        """Tokens per step at most: max_batch_tokens, or the default for `device_kind` ("cpu",
        "cuda": a torch.device's type or telemetry's DeviceInfo.kind)."""
        if self.max_batch_tokens is not None:
            return self.max_batch_tokens
        return CPU_BATCH_TOKENS if device_kind == "cpu" else GPU_BATCH_TOKENS


class EmbeddingConfig(_Strict):
    """`task: embed` only (engine/embed/): what each input's vector is."""

    normalize: bool = True  # L2-normalize each vector (after any `dimensions` truncation)
    dimensions: int | None = Field(None, ge=1)  # keep the first N values (Matryoshka), as OpenAI
    # CPU encoders: batches at once, each on one thread (null: one per torch thread; 1: one
    # batch at a time on every thread). Execution only: the vectors are the same
    cpu_workers: int | None = Field(None, ge=1)


class CostConfig(_Strict):
    gpu_hour_usd: float | None = Field(None, ge=0.0)  # per device-hour (GPU) or vCPU-hour (CPU)
    price_file: str | None = None  # JSON/YAML prices overriding the built-in tables (prices.py)

    @model_validator(mode="after")
    def _price_file_exists(self) -> CostConfig:
        if self.price_file and not Path(self.price_file).is_file():
            raise ValueError(f"cost.price_file {self.price_file!r} is not a file")
        return self


class RayConfig(_Strict):
    """`executor: ray` only. Execution details: they never change the results."""

    address: str | None = None  # null: $RAY_ADDRESS, else a local cluster on this machine
    num_workers: int | None = Field(None, ge=1)  # null: one per GPU (CPU-only: per cpus_per_worker)
    cpus_per_worker: float = Field(
        1.0, gt=0
    )  # CPU cores per worker (CPU-only clusters: its threads)
    block_rows: int = Field(256, ge=1)  # rows per block: the unit of work, retry and commit


EMBED_MODEL = "all-minilm-l6-v2"  # the built-in model of `task: embed` jobs


# input keys added since runs were made -> their default: in the fingerprint only when set
ADDED_INPUT_KEYS = {"special_tokens": "text", "delimiter": None, "partition_columns": True}


class JobConfig(_Strict):
    name: str = "job"  # one line of text: reports' headings, metrics' labels
    task: Literal["generate", "embed"] = "generate"  # embed: one vector per input, no decode
    model: ModelConfig = Field(default_factory=ModelConfig)
    input: InputConfig = Field(default_factory=InputConfig)
    generation: GenerationConfig = Field(default_factory=GenerationConfig)
    output: OutputConfig = Field(default_factory=OutputConfig)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    cost: CostConfig = Field(default_factory=CostConfig)
    executor: Literal["local", "ray"] = "local"
    ray: RayConfig = Field(default_factory=RayConfig)
    embedding: EmbeddingConfig = Field(default_factory=EmbeddingConfig)

    # Where the job file lives; load_job resolved the relative paths in it against its folder.
    source_file: str | None = Field(None, exclude=True)
    # key path -> what load_job resolved it against ("the job file's folder /x"), for errors
    paths_base: dict[str, str] = Field(default_factory=dict, exclude=True)

    @field_validator("name")
    @classmethod
    def _one_line(cls, v: str) -> str:
        if not v.strip() or any(ord(c) < 32 or ord(c) == 127 for c in v):
            raise ValueError("must be one line of text (no newline or control character)")
        return v

    @model_validator(mode="after")
    def _embed_defaults(self) -> JobConfig:
        if self.task != "embed":
            return self
        if "source" not in self.model.model_fields_set:
            self.model.source = EMBED_MODEL
        if self.input.prompt.messages_column:
            raise ValueError(
                "input.prompt.messages_column: an embed job embeds text; use input.prompt.column"
                " or input.prompt.template (no chat template is applied)"
            )
        return self

    def check_token_ids(self, vocab_size: int) -> None:
        """Raise ConfigError (78) when generation.logit_bias or stop_token_ids name a token id
        past the model's vocabulary (`vocab_size`: len(tokenizer)), which every row would fail
        on; once the tokenizer is loaded, before any row runs."""
        if self.task != "generate":  # an embed job samples nothing
            return
        g = self.generation
        for key, ids in (
            ("logit_bias", sorted(g.logit_bias)),
            ("stop_token_ids", g.stop_token_ids),
        ):
            if bad := [t for t in ids if t >= vocab_size]:
                named = ", ".join(map(str, bad[:5])) + (", ..." if len(bad) > 5 else "")
                where = f"{self.source_file}: " if self.source_file else ""  # as check_columns
                raise ConfigError(
                    f"{where}generation.{key}: token id{'s' if len(bad) > 1 else ''} {named} past the"
                    f" model's vocabulary of {vocab_size} tokens (ids 0 to {vocab_size - 1});"
                    " use ids of this model's tokenizer"
                )

    def fingerprint_parts(self) -> dict[str, Any]:
        """What makes two runs 'the same job' (resume refuses a different one)."""
        parts = self._generate_parts()
        if self.task == "embed":  # generate jobs keep the fingerprint they always had
            embedding = self.embedding.model_dump(exclude={"cpu_workers"})  # execution only
            parts["embed"] = {**embedding, "pooling": self.model.pooling}
        return parts

    def _generate_parts(self) -> dict[str, Any]:
        return {
            "model": self.model.model_dump(
                include={
                    "source",
                    "revision",
                    "dtype",
                    "quantization",
                    "kv_cache_dtype",
                    "max_model_len",
                    "keep_in_16bit",
                }
            ),
            "prompt": self.input.model_dump(
                include={
                    "format",
                    "id_column",
                    "prompt",
                    "system_prompt",
                    "use_chat_template",
                    "on_too_long",
                    "response_format_column",
                }
            )
            | self._added_input_part(),
            "generation": self.generation.model_dump(),
            # the shape of result rows and shards: a run's results/ holds one (not shard_rows,
            # shard_seconds or path, which change where and when rows are committed, not them)
            "output": self.output.model_dump(include={"format", "keep_input_columns"}),
        }

    def _added_input_part(self) -> dict[str, Any]:
        """Input keys added since runs were made, where not their default, so that earlier
        runs keep their fingerprint: input.special_tokens (rows without special-token text are
        tokenized the same), input.delimiter (it changes how files are cut into rows) and
        input.partition_columns (off, rows lack their folders' columns)."""
        return {
            key: getattr(self.input, key)
            for key, default in ADDED_INPUT_KEYS.items()
            if getattr(self.input, key) != default
        }


def fingerprint(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


# ---------------------------------------------------------------- loading


def load_job(
    path: str | Path, overrides: list[str] | None = None, executor: str | None = None
) -> JobConfig:
    """Read, override and validate a job file. Raises ConfigError naming file, line and key.

    `overrides` are `--set key.path=value` items; `executor` is `--executor`. An error in a value
    they set is blamed on that argument, not on a line of the file.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the job file: {e.strerror or e}") from e
    try:
        node = yaml.compose(text)
        _check_aliases(node, path)  # before anything walks the values with aliases expanded
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise ConfigError(f"{where}: not valid YAML: {getattr(e, 'problem', e)}") from e
    except RecursionError as e:  # the parser recurses once per level of nesting
        raise ConfigError(f"{path}: values nested too deeply to read; flatten them") from e
    if not isinstance(data, dict):
        raise ConfigError(f"{path}:1: the job file must be a mapping of keys (name, model, ...)")
    lines = _key_lines(node)
    if repeated := _repeated_key(node):
        key, first, again = repeated
        raise ConfigError(
            f"{path}:{again} {key}: this key is given twice (first at line {first}); YAML would"
            " keep the last one silently: keep one"
        )
    args: dict[tuple, str] = {}  # key path -> the command-line argument that set it
    for item in overrides or []:
        args[apply_override(data, item)] = f"--set {item}"
    if executor is not None:
        data["executor"] = executor
        args[("executor",)] = f"--executor {executor}"
    base = Path.cwd() if ("input", "path") in args else path.absolute().parent
    for key in INTERNAL_KEYS:  # fields load_job sets, never a job file's keys
        if key in data:
            where = f"{path}:{lines[(key,)]}" if (key,) in lines else str(path)
            raise ConfigError(
                f"{where} {key}: unknown key (every key: docs/DESIGN.md, section 4 'The job file')"
            )
    if "task" not in data and _embeddings_batch(data.get("input"), base):
        data["task"] = "embed"  # /v1/embeddings lines imply an embed job
    try:
        cfg = JobConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_describe(e, path, lines, args)) from e
    cfg.source_file = str(path)
    _resolve_paths(cfg, path.absolute().parent, args)
    return cfg


PATH_KEYS = ("input.path", "output.path", "model.source")
INTERNAL_KEYS = ("source_file", "paths_base")  # JobConfig fields load_job fills in


def _resolve_paths(cfg: JobConfig, job_dir: Path, args: dict[tuple, str]) -> None:
    """Relative paths in the job file resolve against its folder (as docker compose and dbt
    do), so a job runs the same from any working directory; `--set` paths resolve against the
    working directory, where the user typed them. URLs and absolute paths are kept."""
    for key in PATH_KEYS:
        section, name = key.split(".")
        value = getattr(getattr(cfg, section), name)
        from_cli = tuple(key.split(".")) in args
        base = Path.cwd() if from_cli else job_dir
        resolved = _resolve_path(value, base, is_model=key == "model.source")
        if resolved is not None:
            setattr(getattr(cfg, section), name, resolved)
            where = "the working directory" if from_cli else "the job file's folder"
            cfg.paths_base[key] = f"{value!r} relative to {where}, {base}"


def relocate_paths(data: dict, job_file: Path, target: Path) -> None:
    """Rewrite the relative paths of a job file's data so that they still name the same files
    when the job is written to `target` (another folder)."""
    src, dst = job_file.absolute().parent, target.absolute().parent
    for key in PATH_KEYS:
        section, name = key.split(".")
        value = (data.get(section) or {}).get(name)
        if isinstance(value, str):
            resolved = _resolve_path(value, src, is_model=key == "model.source")
            if resolved is not None:
                data[section][name] = os.path.relpath(resolved, dst)


def _resolve_path(value: str, base: Path, is_model: bool) -> str | None:
    """The absolute path for a relative one, or None to keep the value as it is."""
    if not value or "://" in value or Path(value).expanduser().is_absolute():
        return None
    candidate = base / value
    if is_model:  # a model source is a path only when it looks like one (else an alias, hub id)
        looks_like_path = value.endswith(".gguf") or value.startswith(".") or candidate.exists()
        if not looks_like_path:
            return None
    return os.path.normpath(candidate)


def _embeddings_batch(section: Any, base: Path) -> bool:
    """The input is OpenAI batch files whose first line asks for /v1/embeddings: the first
    `.jsonl` file (compressed ones too) the path names, as a file, a directory, a glob or a
    store prefix (a relative path read from `base`, as _resolve_paths will resolve it)."""
    section = section if isinstance(section, dict) else {}
    path, fmt = str(section.get("path") or ""), section.get("format", "auto")
    if fmt not in ("auto", "openai-batch") or not path:
        return False
    try:
        where = _resolve_path(path, base, is_model=False) or path
        files = find_files(where, BATCH_SUFFIXES, quiet=True)
        if fmt == "auto":  # a file named alone may be of any format
            files = [f for f in files if full_suffix(f) in BATCH_SUFFIXES]
        with open_input(files[0]) as f:
            first = next((line for line in f if line.strip()), b"")
        return json.loads(first).get("url") == "/v1/embeddings"
    except (OSError, ValueError, AttributeError, IndexError, RecursionError, JobError) as e:
        if from_store_error(e) is not None:  # asked again later, it would cost its retries again
            raise
        return False  # no such file, or not a batch line: the readers say what is wrong


BATCH_SUFFIXES = {".jsonl", *(f".jsonl{codec}" for codec in CODECS)}  # an OpenAI batch file's


def apply_override(data: dict, item: str) -> tuple[str, ...]:
    """`key.path=value`; the value is parsed as YAML (`64`, `true`, `[a, b]`, `null`).

    Returns the key path it set."""
    if "=" not in item:
        raise ConfigError(f"--set {item!r}: expected key.path=value")
    key, _, raw = item.partition("=")
    parts = key.strip().split(".")
    if not all(parts):
        raise ConfigError(f"--set {item!r}: empty key in {key!r}")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    cur = data
    for p in parts[:-1]:
        nxt = cur.setdefault(p, {})
        if not isinstance(nxt, dict):
            raise ConfigError(f"--set {item!r}: {p} is not a section")
        cur = nxt
    cur[parts[-1]] = value
    return tuple(parts)


def key_paths(model: type[BaseModel] = JobConfig, prefix: str = "") -> list[str]:
    """Every job-file key, sections and nested keys alike: `model`, `model.source`, ..."""
    out = []
    for name, f in model.model_fields.items():
        if f.exclude:
            continue
        out.append(prefix + name)
        if isinstance(f.annotation, type) and issubclass(f.annotation, BaseModel):
            out.extend(key_paths(f.annotation, f"{prefix}{name}."))
    return out


def nearest_key(key: str) -> str | None:
    """The known key path closest to a misspelled one, or None when nothing is close."""
    known = key_paths()
    leaf = key.rsplit(".", 1)[-1]
    near = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    if not near:  # a right name in the wrong section: match the last part alone
        by_leaf = {k.rsplit(".", 1)[-1]: k for k in known}
        near = [by_leaf[m] for m in difflib.get_close_matches(leaf, by_leaf, n=1, cutoff=0.75)]
    return near[0] if near else None


# Values of a job file with its aliases (*name) expanded: a real job has hundreds; a few nested
# aliases ("billion laughs") expand a kilobyte to billions, which nothing downstream could walk.
MAX_EXPANDED_VALUES = 100_000


def _check_aliases(node: yaml.Node | None, path: Path) -> None:
    """Refuse (78) a file whose aliases expand past MAX_EXPANDED_VALUES or hold themselves."""
    sizes: dict[int, int] = {}  # node id -> values under it expanded; -1 while it is walked

    def size(n: yaml.Node) -> int:
        if sizes.get(id(n)) == -1:
            raise ConfigError(
                f"{path}:{n.start_mark.line + 1}: an alias here refers to a value that holds it;"
                " remove the alias"
            )
        if id(n) not in sizes:
            sizes[id(n)] = -1
            kids = [x for kv in n.value for x in kv] if isinstance(n, yaml.MappingNode) else []
            kids = n.value if isinstance(n, yaml.SequenceNode) else kids
            sizes[id(n)] = min(1 + sum(size(k) for k in kids), MAX_EXPANDED_VALUES + 1)
        return sizes[id(n)]

    if node is not None and size(node) > MAX_EXPANDED_VALUES:
        raise ConfigError(
            f"{path}: its aliases (*name) expand to more than {MAX_EXPANDED_VALUES:,} values;"
            " write the values out, or use fewer aliases"
        )


def _repeated_key(node: yaml.Node | None) -> tuple[str, int, int] | None:
    """(key path, its first line, the line repeating it) of the first key a mapping gives
    twice; each node looked at once (aliases share theirs)."""
    todo: list[tuple[yaml.Node | None, str]] = [(node, "")]
    seen: set[int] = set()
    while todo:
        n, where = todo.pop()
        if id(n) in seen or not isinstance(n, yaml.MappingNode | yaml.SequenceNode):
            continue
        seen.add(id(n))
        if isinstance(n, yaml.SequenceNode):
            todo += [(v, f"{where}.{i}" if where else str(i)) for i, v in enumerate(n.value)]
            continue
        first: dict[str, int] = {}
        for k, v in n.value:
            name = f"{where}.{k.value}" if where else str(k.value)
            line = k.start_mark.line + 1
            if k.value in first and k.tag != "tag:yaml.org,2002:merge":
                return name, first[k.value], line
            first[k.value] = line
            todo.append((v, name))
    return None


def _key_lines(node: yaml.Node | None, prefix: tuple = ()) -> dict[tuple, int]:
    """Map each key path to its 1-based line in the file."""
    out: dict[tuple, int] = {}
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            path = prefix + (k.value,)
            out[path] = k.start_mark.line + 1
            out.update(_key_lines(v, path))
    elif isinstance(node, yaml.SequenceNode):
        for i, v in enumerate(node.value):
            out[prefix + (i,)] = v.start_mark.line + 1
            out.update(_key_lines(v, prefix + (i,)))
    return out


def _describe(
    err: ValidationError, path: Path, lines: dict[tuple, int], args: dict[tuple, str]
) -> str:
    msgs = []
    for e in err.errors():
        loc = tuple(x for x in e["loc"] if not (isinstance(x, str) and x.startswith("function-")))
        if loc[-1:] == ("[key]",):  # a mapping's key (logit_bias's): named by the mapping
            loc, e = loc[:-2], {**e, "of_key": True}
        key = ".".join(str(x) for x in loc) or "(top level)"
        arg = next(((k, a) for k, a in args.items() if loc[: len(k)] == k), None)
        if arg:  # a command-line argument set it: blame the argument, not the file
            msgs.append(f"{arg[1]}: {key} {_humanize(e, key)}{_set_hint(e, loc, *arg)}")
            continue
        line = _nearest_line(loc, lines)
        where = f"{path}:{line}" if line else str(path)
        msgs.append(f"{where} {key}: {_humanize(e, key)}{_yaml_hint(e)}")
    return "\n".join(msgs)


# A value of the wrong YAML type (the models are strict: nothing is coerced): what it must be
_WANTED = {
    "int_type": "an integer",
    "float_type": "a number",
    "bool_type": "true or false",
    "string_type": "text",
    "list_type": "a list",
    "dict_type": "a mapping",
    "model_type": "a mapping of keys",
}


def _yaml_hint(e: dict) -> str:
    """How to write, in YAML, a value that was read as another type than its key's."""
    kind, got = e["type"], e.get("input")
    if e.get("of_key"):
        return ""
    if kind == "int_type" and isinstance(got, float) and got.is_integer():
        return f" (write a whole number: {int(got)})"
    if kind in ("int_type", "float_type", "bool_type") and isinstance(got, str):
        return " (quoted, so YAML reads it as text: remove the quotes)" if _unquoted(e) else ""
    if kind != "string_type" or got is None or isinstance(got, str):
        return ""
    if isinstance(got, bool):
        return " (YAML reads unquoted yes, no, on, off, true and false as booleans: quote it)"
    return " (quote it for text)"


def _unquoted(e: dict) -> bool:
    """The text of a value the key wanted as a number or a boolean is one without its quotes."""
    try:
        value = yaml.safe_load(e["input"])
    except yaml.YAMLError:
        return False
    if isinstance(value, bool):  # before int: a bool is an int in Python
        return e["type"] == "bool_type"
    return isinstance(value, {"int_type": int, "float_type": int | float}.get(e["type"], ()))


def _set_hint(e: dict, loc: tuple, key: tuple, arg: str) -> str:
    """--set parses its value as YAML: `5` is a number, `{prompt}` a mapping and `[x]` a list
    there; text that YAML reads otherwise must be quoted."""
    raw = arg.partition("=")[2].strip()
    if e["type"] != "string_type" or loc != key or not raw or not _yaml_hint(e):
        return _yaml_hint(e)
    name = arg.removeprefix("--set ").partition("=")[0]
    return f" (the value was read as YAML; quote it for text: --set '{name}=\"{raw}\"')"


def _nearest_line(loc: tuple, lines: dict[tuple, int]) -> int | None:
    for n in range(len(loc), 0, -1):
        for head in (loc[:n], tuple(map(str, loc[:n]))):  # YAML gives a mapping's keys as text
            if head in lines:
                return lines[head]
    return None


def _humanize(e: dict, key: str) -> str:
    kind, ctx = e["type"], e.get("ctx") or {}
    if kind == "extra_forbidden":
        near = nearest_key(key)
        hint = f"did you mean {near}? " if near else ""
        return f"unknown key; {hint}(every key: docs/DESIGN.md, section 4 'The job file')"
    if want := _WANTED.get(kind):
        whose = "each key " if e.get("of_key") else ""
        return f"{whose}must be {want}, got {_shown(e.get('input'))}"
    if kind == "literal_error":
        return f"must be one of {ctx.get('expected')}, got {e.get('input')!r}"
    for op, word in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
        if (
            kind
            == f"{'greater' if op[0] == 'g' else 'less'}_than{'_equal' if op[1] == 'e' else ''}"
        ):
            return f"must be {word} {ctx.get(op)}, got {e.get('input')!r}"
    msg = e["msg"]
    return msg.removeprefix("Value error, ")


def _shown(value: Any) -> str:
    """A value as the YAML that gives it (true, null, 'text', 2.0), cut short when long."""
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
