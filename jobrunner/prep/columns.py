"""The job's column names checked against the input's columns, before any row or model.

A template field, a prompt, messages, id or priority column that the input lacks would fail
every row; it is one configuration error instead (exit 78), raised before the model loads:
`template field {titel} is not a column; columns: id, title, body; did you mean title?`.

Columns are read from the first rows of each file through the readers (Parquet and CSV: the
schema; JSONL: the keys of the first SAMPLE_ROWS lines), with the file's partition columns
(io/partitions.py). OpenAI batch files carry their own fields and are not checked here.
"""

from __future__ import annotations

import difflib
import itertools
import logging
from dataclasses import dataclass

from jobrunner.config import JobConfig
from jobrunner.errors import ConfigError, InputDataError
from jobrunner.formats import detect_format, input_files, read_file
from jobrunner.io.readers import RawRow
from jobrunner.prep.render import RenderError, template_fields

SAMPLE_ROWS = 100  # JSONL lines read for their keys
MAX_FILES = 64  # files checked; a corpus of many shards shares one schema
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class InputColumns:
    file: str
    columns: tuple[str, ...]


def check_columns(cfg: JobConfig) -> list[InputColumns]:
    """Raise ConfigError naming every job column the input lacks; return what was read."""
    seen = [c for c in (file_columns(f, cfg) for f in _files(cfg)[:MAX_FILES]) if c]
    problems: dict[str, str] = {}  # each problem once, with the first file that has it
    lacking: dict[str, list[str]] = {}  # a column some files have: the files without it
    for found in seen:
        for name, p in _problems(cfg, found):
            if name is not None and any(name in f.columns for f in seen):
                lacking.setdefault(name, []).append(found.file)
            else:
                problems.setdefault(p, found.file)
    if problems:
        where = f"{cfg.source_file}: " if cfg.source_file else ""
        raise ConfigError("\n".join(f"{where}{p} (in {f})" for p, f in problems.items()))
    col = cfg.input.id_column
    if col and seen and not _names_id(cfg) and not any(col in f.columns for f in seen):
        log.info(
            "the input has no %r column: row ids are derived from the file name and row"
            " number (set input.id_column to name the id column, or null to say so)",
            col,
        )
    for name, files in lacking.items():
        _note_lacking(name, files, len(seen))
    return seen


def _note_lacking(name: str, files: list[str], checked: int) -> None:
    """A column added to later files (a dataset whose schema grew): the rows of the files
    without it fail alone (missing_field, naming it), as rows whose value is null do."""
    more = f" and {len(files) - 3} more" if len(files) > 3 else ""
    log.warning(
        "column %r is missing from %d of the %d input files checked (%s%s): their rows fail"
        " with missing_field",
        name,
        len(files),
        checked,
        ", ".join(files[:3]),
        more,
    )


def file_columns(file: str, cfg: JobConfig) -> InputColumns | None:
    """The columns of one input file, or None for a format that has no columns to check."""
    kind = detect_format(file, cfg.input.format)
    if kind == "openai-batch":
        return None
    names: dict[str, None] = {}
    for item in itertools.islice(read_file(file, cfg.input, SAMPLE_ROWS, kind), SAMPLE_ROWS):
        if isinstance(item, RawRow):
            names.update(dict.fromkeys(item.values))
    return InputColumns(file, tuple(names)) if names else None


def _files(cfg: JobConfig) -> list[str]:
    try:
        return input_files(cfg.input.path, cfg.input.format)
    except InputDataError as e:
        note = cfg.paths_base.get("input.path")
        raise InputDataError(f"{e} ({note})" if note else str(e)) from e


def _names_id(cfg: JobConfig) -> bool:
    """True when the job names its id column itself (not the default `id`)."""
    return "id_column" in cfg.input.model_fields_set


def _problems(cfg: JobConfig, found: InputColumns) -> list[tuple[str | None, str]]:
    """(the column, what is wrong) for each job column this file lacks; the column is None
    where every file must have it (a named id column: a file without it would derive its
    ids)."""
    inp, cols = cfg.input, found.columns
    wanted = [
        ("input.prompt.column", "the prompt column", inp.prompt.column, ""),
        ("input.prompt.messages_column", "the messages column", inp.prompt.messages_column, ""),
        ("input.priority_column", "the priority column", inp.priority_column, ""),
    ]
    if _names_id(cfg):  # the default `id` may be absent: ids are then derived
        derive = "; or input.id_column: null makes ids of the file name and row number"
        wanted.append(("input.id_column", "the id column", inp.id_column, derive))
    out = [
        (
            None if key == "input.id_column" else name,
            f"{key}: {what} {name!r} is not a column; {_columns_hint(name, found, cfg)}{tail}",
        )
        for key, what, name, tail in wanted
        if name and name not in cols
    ]
    if inp.prompt.template:
        try:
            fields = template_fields(inp.prompt.template)
        except RenderError as e:
            return [*out, (None, f"input.prompt.template: {e}")]
        out += [
            (
                f,
                f"input.prompt.template: template field {{{f}}} is not a column;"
                f" {_columns_hint(f, found, cfg)}",
            )
            for f in dict.fromkeys(fields)
            if f not in cols
        ]
    return out


def _columns_hint(name: str, found: InputColumns, cfg: JobConfig) -> str:
    hint = f"columns: {', '.join(found.columns)}"
    if any(d.startswith(f"{name}=") for d in found.file.split("/")[:-1]):  # date=2024-01-01/
        return f"{hint}; {_partition_hint(name, cfg)}"
    near = difflib.get_close_matches(name, found.columns, n=1, cutoff=0.6)
    return f"{hint}; did you mean {near[0]}?" if near else hint


def _partition_hint(name: str, cfg: JobConfig) -> str:
    """A Hive partition key (a `name=...` folder) that is not a column: why, and the way."""
    if not cfg.input.partition_columns:
        return (
            f"{name} is a Hive partition key ({name}=... folders), read as a column unless"
            " input.partition_columns is false, as this job sets it"
        )
    return (
        f"{name} is a Hive partition key ({name}=... folders) above the input root:"
        " only folders below the folder, glob or prefix input.path names are columns (a"
        " single file has none), so name the table's top folder in input.path"
    )
