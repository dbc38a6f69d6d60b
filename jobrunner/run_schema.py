"""A run's schema: one Arrow type per result column, decided once for the run and kept in its
manifest (`Manifest.schema`), so every shard of the run, a resumed run's and a Ray worker's
included, has the same columns and types, and results/ reads as one table.

The input's columns (`output.keep_input_columns`) take the types its files give them: a Parquet
file's own, strings for CSV, for JSONL the types over every line (formats/columns.py), strings
for partition columns after the file's own (io/partitions.py); where files disagree, one common
type or JSON text (formats/columns.unify). They are named as result rows carry them
(prep/prepare.py: a text id column is `id`, a clash renamed `input_X`). The result's own columns
have fixed types (`result_fields`). A format without a `schema` role (OpenAI batch files, whose
preparer picks its own columns) leaves its columns typed per shard.
"""

from __future__ import annotations

import base64
from typing import Any

from jobrunner.config import JobConfig
from jobrunner.formats import detect_format, file_partitions, input_files, input_format
from jobrunner.formats.columns import is_json_text, unify
from jobrunner.io.partitions import with_fields
from jobrunner.prep.prepare import renamed_input_columns


def settle(manifest: Any, cfg: JobConfig, typed: dict[str, Any] | None = None) -> Any:
    """The run's schema: the manifest's, else decided now and recorded there (saved with the
    manifest at the first commit; a run stopped before it decides the same again). `typed`:
    files' schemas a pass over their rows already made (input_scan.Scan.schemas)."""
    if manifest.schema:
        return from_json(manifest.schema)
    schema = decide(cfg, typed)
    manifest.schema = to_json(schema)
    return schema


def decide(cfg: JobConfig, typed: dict[str, Any] | None = None) -> Any:
    import pyarrow as pa

    return pa.schema([*(input_fields(cfg, typed or {}) or []), *result_fields(cfg)])


def input_fields(cfg: JobConfig, typed: dict[str, Any] | None = None) -> list | None:
    """The input's columns as result rows carry them; None when the format has no schema.
    A file in `typed` takes the schema given there, else its format's `schema` reads it."""
    if not cfg.output.keep_input_columns:
        return []
    files = input_files(cfg.input.path, cfg.input.format)
    formats = [input_format(detect_format(f, cfg.input.format)) for f in files]
    if any(fmt.schema is None or fmt.preparer is not None for fmt in formats):
        return None
    typed, options = typed or {}, cfg.input.read_options
    schemas = [
        with_fields(
            typed.get(f) or fmt.schema(f, options), file_partitions(f, cfg.input, fmt.name), f
        )
        for f, fmt in zip(files, formats, strict=True)
    ]
    schema = unify(schemas)
    fields = [f for f in schema if not _id_text(f, cfg.input.id_column)]
    names = renamed_input_columns(dict.fromkeys(f.name for f in fields))
    return [f.with_name(n) for f, n in zip(fields, names, strict=True)]


def _id_text(field: Any, id_column: str | None) -> bool:
    """A text id column is the result's `id` (Preparer._columns drops it from the row)."""
    import pyarrow as pa

    t = field.type
    if pa.types.is_dictionary(t):
        t = t.value_type
    text = pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)
    return field.name == id_column and text and not is_json_text(field)


def result_fields(cfg: JobConfig) -> list:
    """The result's own columns (io/writers.result_record), with the types they always had;
    `logprobs` and `choices` where the job asks for them. `embedding` is typed per shard by
    formats/parquet.embedding_column (its width is the model's)."""
    import pyarrow as pa

    s, i64 = pa.string(), pa.int64()
    fields = [
        ("id", s),
        ("completion", s),
        ("finish_reason", s),
        ("prompt_tokens", i64),
        ("cached_tokens", i64),
        ("completion_tokens", i64),
        ("cost_usd", pa.float64()),
        ("model", s),
        ("structure", s),
    ]
    g = cfg.generation
    if cfg.task == "generate" and (g.logprobs or g.top_logprobs > 0):
        fields.append(("logprobs", LOGPROBS()))
    if cfg.task == "generate" and g.n > 1:
        fields.append(("choices", CHOICES()))
    return [pa.field(n, t) for n, t in fields]


def TOKEN():  # noqa: N802  (a type, built where pyarrow is imported)
    import pyarrow as pa

    return [
        ("token", pa.string()),
        ("token_id", pa.int64()),
        ("logprob", pa.float64()),
        ("bytes", pa.list_(pa.int64())),
    ]


def LOGPROBS():  # noqa: N802
    import pyarrow as pa

    return pa.list_(pa.struct([*TOKEN(), ("top_logprobs", pa.list_(pa.struct(TOKEN())))]))


def CHOICES():  # noqa: N802
    import pyarrow as pa

    return pa.list_(
        pa.struct(
            [
                ("index", pa.int64()),
                ("text", pa.string()),
                ("finish_reason", pa.string()),
                ("completion_tokens", pa.int64()),
                ("logprobs", LOGPROBS()),
                ("structure", pa.string()),
            ]
        )
    )


def to_json(schema: Any) -> dict[str, Any]:
    """The manifest's form: the Arrow schema exactly (IPC, base64), and each column's type as
    text for a reader of manifest.json."""
    return {
        "arrow": base64.b64encode(schema.serialize().to_pybytes()).decode("ascii"),
        "columns": {
            f.name: str(f.type) + (" (JSON text)" if is_json_text(f) else "") for f in schema
        },
    }


def from_json(data: dict[str, Any]) -> Any:
    import pyarrow as pa

    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(data["arrow"])))
