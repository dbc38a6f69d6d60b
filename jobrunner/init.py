"""`jobrunner init DATA`: a commented job file for a data file or folder, that runs as is.

The input's columns are read (the first SAMPLE_ROWS rows of its first file, with the partition
columns its folders give it: io/partitions.py), an id column and a prompt are proposed (a
prompt or messages column when there is one, else a template over the text columns), and the
main keys are written with their defaults and a comment each.
"""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path
from typing import Any

from jobrunner.config import JobConfig, load_job
from jobrunner.errors import ConfigError, InputDataError
from jobrunner.formats import detect_format, input_files, input_format, partitions_of
from jobrunner.io.compressed import plain_name
from jobrunner.io.csv_rows import file_delimiter
from jobrunner.io.fs import filesystem, is_remote
from jobrunner.io.partitions import with_partitions
from jobrunner.io.readers import RawRow
from jobrunner.io.writers import check_file_target
from jobrunner.prep.render import BYTES, nameable

SAMPLE_ROWS = 100
ID_NAMES = ("id", "custom_id", "uuid", "key", "row_id", "doc_id")
PROMPT_NAMES = ("prompt", "question", "instruction", "input", "query")
MESSAGES_NAMES = ("messages", "conversation", "chat")
INSTRUCTION = "Summarize the following in one sentence."


def write_job_file(data_file: str, target: Path | None, force: bool) -> tuple[Path, str]:
    """Write the job file; returns its path and a few lines saying what was proposed. A data
    file in an object store (a URL) is named as it is, and its job file goes to the working
    directory unless -o says where. A folder (a store prefix) is sampled by its first file."""
    remote = is_remote(data_file)
    first = _first_file(data_file, remote)
    plain = Path(plain_name(data_file))  # posts.csv.gz: the job is posts.yaml too
    target = target or (Path(plain.name) if remote else plain).with_suffix(".yaml")
    check_file_target(target, "-o")
    if target.exists() and not force:
        raise ConfigError(f"{target} exists; pass -o PATH for another file, or --force")
    kind = detect_format(first, "auto")
    rows = _sample(first, kind, data_file)
    job_dir = target.absolute().parent
    rel_input = data_file if remote else os.path.relpath(Path(data_file).absolute(), job_dir)
    if kind == "openai-batch":
        text, said = _openai_batch_job(plain.stem, rel_input), "an OpenAI batch file"
    else:
        delimiter = _delimiter(data_file, first, kind)
        text, said = _job_text(plain.stem, rel_input, rows, delimiter)
    target.write_text(text, encoding="utf-8")
    load_job(target)  # what we wrote must load: a bug here is ours, not the user's
    return target, said


def _first_file(data: str, remote: bool) -> str:
    """`data` where it is a file, else the first input file of the folder (prefix) it names."""
    if _is_object(data) if remote else Path(data).is_file():
        return data
    if remote or Path(data).is_dir():
        try:
            return input_files(data)[0]
        except InputDataError:
            pass  # no folder, or none of its files is data: said below
    raise InputDataError(
        f"{data}: no such file, nor a folder of data files (give a .csv, .tsv, .parquet or"
        " .jsonl file, or a folder of them)"
    )


def _delimiter(data: str, first: str, kind: str) -> str | None:
    """The separator input.delimiter names: a CSV file's own. A folder's files are each cut by
    their own (a .tsv beside a .csv), so one file's is not written for them all."""
    return file_delimiter(first) if kind == "csv" and first == data else None


def _is_object(url: str) -> bool:
    fs, p = filesystem(url)
    return fs.isfile(p)


def _sample(file: str, kind: str, path: str) -> list[dict[str, Any]]:
    """The first rows of `file`, with the partition columns its folders below `path` give."""
    if kind == "openai-batch":
        return []
    read = input_format(kind).read(file, SAMPLE_ROWS)
    items = itertools.islice(with_partitions(read, partitions_of(file, path, kind)), SAMPLE_ROWS)
    rows = [i.values for i in items if isinstance(i, RawRow)]
    if not rows:
        raise InputDataError(f"{file}: no readable rows to take the columns from")
    return rows


def _columns(rows: list[dict[str, Any]]) -> list[str]:
    return list(dict.fromkeys(k for r in rows for k in r))


def propose(rows: list[dict[str, Any]]) -> tuple[str | None, dict[str, str]]:
    """(id column or None, the prompt mapping) for these sample rows."""
    cols = _columns(rows)
    id_col = next((c for c in ID_NAMES if c in cols and _unique(rows, c)), None)
    if id_col is None:
        id_col = next((c for c in cols if c.endswith("_id") and _unique(rows, c)), None)
    lower = {c.lower(): c for c in cols}
    for name in MESSAGES_NAMES:
        if name in lower:
            return id_col, {"messages_column": lower[name]}
    msgs = next((c for c in cols if all(_is_messages(r.get(c)) for r in rows)), None)
    if msgs:
        return id_col, {"messages_column": msgs}
    for name in PROMPT_NAMES:
        if name in lower and _is_text(rows, lower[name]):
            return id_col, {"column": lower[name]}
    text_cols = [c for c in cols if c != id_col and nameable(c) and _is_text(rows, c)]
    if not text_cols:
        raise ConfigError(
            f"no text column to make a prompt from (columns: {', '.join(cols)});"
            " write the job by hand (docs/DESIGN.md, section 4)"
        )
    if len(text_cols) == 1:
        return id_col, {"template": f"{INSTRUCTION}\n\n{{{text_cols[0]}}}"}
    fields = "\n".join(f"{c}: {{{c}}}" for c in text_cols)
    return id_col, {"template": f"{INSTRUCTION}\n\n{fields}"}


def _unique(rows: list[dict[str, Any]], col: str) -> bool:
    values = [r.get(col) for r in rows]
    ok = all(isinstance(v, (str, int)) and not isinstance(v, bool) for v in values)
    return ok and len(set(values)) == len(values)


def _is_text(rows: list[dict[str, Any]], col: str) -> bool:
    """Strings, or bytes of UTF-8 text (Hive's and Impala's Parquet strings), which prompts
    read as text (render.binary_text)."""
    values = [r.get(col) for r in rows if r.get(col) is not None]
    return bool(values) and all(isinstance(v, str) or _utf8(v) for v in values)


def _utf8(v: Any) -> bool:
    if not isinstance(v, BYTES):
        return False
    try:
        bytes(v).decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _is_messages(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(m, dict) and "role" in m for m in v)


def _prompt_yaml(prompt: dict[str, str]) -> str:
    ((key, value),) = prompt.items()
    if key != "template":
        return f"  prompt: {{{key}: {value}}}"
    body = "\n".join(f"      {line}" if line else "" for line in value.split("\n"))
    return f"  prompt:\n    template: |-   # {{column}} fields only; no code runs\n{body}"


def _y(v: Any) -> str:
    """A YAML scalar: JSON's spelling is valid YAML (strings quoted, null, true, lists)."""
    return json.dumps(v)


def _kv(key: str, value: Any, comment: str = "", indent: int = 2) -> str:
    """One `key: value  # comment` line, comments aligned."""
    text = " " * indent + f"{key}: {value if isinstance(value, str) else _y(value)}"
    return f"{text:<38}# {comment}" if comment else text


def _delimiter_lines(delimiter: str | None) -> list[str]:
    """input.delimiter where a CSV file is not separated by commas: the job says what it reads."""
    if delimiter in (None, ","):
        return []
    return [_kv("delimiter", _y(delimiter), "the separator of the file's fields")]


def _job_text(
    stem: str, rel_input: str, rows: list[dict[str, Any]], delimiter: str | None = None
) -> tuple[str, str]:
    d = JobConfig()
    m, i, g, o, e = d.model, d.input, d.generation, d.output, d.engine
    id_col, prompt = propose(rows)
    cols = _columns(rows)
    id_line = (
        _kv("id_column", id_col, "unique per row; resume and results join on it")
        if id_col
        else _kv("id_column", "null", "no id column found: ids are file name:row number")
    )
    lines = [
        f"# A jobrunner job for {rel_input}, written by `jobrunner init` (edit freely).",
        "# Relative paths resolve against this file's folder. Every key: docs/DESIGN.md, section 4.",
        f"# Check it without loading a model:  jobrunner validate {stem}.yaml",
        f"# Run it (resumes if stopped):       jobrunner run {stem}.yaml",
        f"name: {stem}",
        "model:",
        _kv("source", m.source, "built-in alias | local HF dir | .gguf file | hub id"),
        _kv("dtype", m.dtype, "auto: bfloat16 on CUDA and AMX CPUs, else float32"),
        _kv("max_model_len", m.max_model_len, "prompt plus new tokens"),
        "input:",
        _kv("path", _y(rel_input), "relative to this file's folder"),
        *_delimiter_lines(delimiter),
        f"  # columns found: {', '.join(cols)}",
        id_line,
        _prompt_yaml(prompt),
        _kv("system_prompt", i.system_prompt, "a system message before every prompt"),
        _kv("on_too_long", i.on_too_long, "error | truncate_left | truncate_right"),
        _kv("max_error_rate", i.max_error_rate, "more failed rows than this share: exit 65"),
        "generation:",
        _kv("max_new_tokens", g.max_new_tokens, "new tokens per row at most"),
        _kv("temperature", g.temperature, "0: greedy (the same output every run)"),
        _kv("top_p", g.top_p),
        _kv("seed", g.seed, "with the row id, seeds each row's sampling"),
        _kv("stop", g.stop, "stop strings"),
        "output:",
        _kv("path", _y("out/" + stem), "the run directory: results/, report.md, errors.jsonl"),
        _kv("format", o.format, "parquet | jsonl | openai-batch"),
        _kv("keep_input_columns", o.keep_input_columns, "results carry the input's columns"),
        "engine:",
        _kv("kind", e.kind, "paged | static"),
        _kv("max_num_seqs", e.max_num_seqs, "rows in flight at most"),
        _kv("prefix_caching", e.prefix_caching, "rows sharing a prompt head compute it once"),
    ]
    text = "\n".join(lines) + "\n"
    kind = next(iter(prompt))
    said = {
        "column": f"prompt: the {prompt.get('column')!r} column",
        "messages_column": f"prompt: the chat messages in {prompt.get('messages_column')!r}",
        "template": "prompt: a template over the text columns (edit it)",
    }[kind]
    ids = f"ids: {id_col!r}" if id_col else "ids: derived (no id column)"
    return text, f"columns: {', '.join(cols)}\n{ids}; {said}"


def _openai_batch_job(stem: str, rel_input: str) -> str:
    return f"""\
# A jobrunner job for the OpenAI batch file {rel_input}, written by `jobrunner init`.
# Relative paths resolve against this file's folder. Every key: docs/DESIGN.md, section 4.
name: {stem}
model:
  source: {JobConfig().model.source}   # every line runs on this model (body.model is not used)
input:
  path: {_y(rel_input)}
  format: openai-batch
output:
  path: {_y("out/" + stem)}             # output.jsonl and errors.jsonl, as the Batch API writes them
  format: openai-batch
"""
