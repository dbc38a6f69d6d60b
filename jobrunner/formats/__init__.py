"""Data formats, by `input.format` / `output.format`: every built-in one is registered here.

A format is one module (or folder) holding its reader, preparer and writer (formats/base.py
says what each role is). To add one, see "Add a format" in docs/DESIGN.md.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from jobrunner.errors import ConfigError, InputDataError
from jobrunner.formats import csv, jsonl, openai_batch, parquet
from jobrunner.formats.base import Format
from jobrunner.io.compressed import CODECS, codec, data_suffix, full_suffix
from jobrunner.io.partitions import Values, partition_values, with_partitions
from jobrunner.io.readers import Item, ReadOptions, find_files
from jobrunner.prep.embed import EmbedPreparer
from jobrunner.prep.prepare import Preparer
from jobrunner.registry import Registry

FORMATS: Registry[Format] = Registry(
    "format", {f.name: f for f in (parquet.FORMAT, jsonl.FORMAT, csv.FORMAT, openai_batch.FORMAT)}
)


def input_format(name: str) -> Format:
    readable = {f.name: f for f in FORMATS.values() if f.read}
    if name not in readable:
        raise ConfigError(f"input.format: {name!r} is not one of {', '.join(readable)}")
    return readable[name]


def output_format(name: str) -> Format:
    writable = {f.name: f for f in FORMATS.values() if f.writable}
    if name not in writable:
        raise ConfigError(f"output.format: {name!r} is not one of {', '.join(writable)}")
    return writable[name]


def shard_format(name: str) -> Format:
    """The format result shards of `output.format: name` are written in."""
    return FORMATS.get(output_format(name).shard_format)


def input_files(path: str, fmt: str = "auto") -> list[str]:
    """The files a job reads: a file, every file of a known format in a directory (compressed
    too, where the format is a stream of text: `.jsonl.gz`), a glob. With a format named
    (`fmt` not `auto`), a directory's files without a suffix too: Hive names its files
    `000000_0`."""
    suffixes = {s for f in FORMATS.values() for s in f.suffixes}
    packed = {s + c for f in FORMATS.values() if f.compressed for s in f.suffixes for c in CODECS}
    bare = {""} if fmt != "auto" else set()
    return find_files(path, suffixes | packed | bare)


def detect_format(file: str, fmt: str) -> str:
    """The format `file` is read as: `fmt`, or by its suffix (under a codec's) for `auto`."""
    packed = codec(file)  # first: a compression we do not read is refused by name
    kind = fmt if fmt != "auto" else _by_suffix(file)
    if packed and not FORMATS.get(kind).compressed:
        raise InputDataError(
            f"{file}: a compressed {kind} file is not read (line formats are: JSONL, CSV, OpenAI"
            " batch files; Parquet compresses inside); decompress it and run again"
        )
    return kind


def _by_suffix(file: str) -> str:
    suffix = data_suffix(file)
    kind = next((f.name for f in FORMATS.values() if suffix in f.suffixes), None)
    if kind is None:
        said = full_suffix(file) or Path(file).name
        raise InputDataError(f"{file}: cannot tell the format from {said!r}; set input.format")
    return next((f.name for f in FORMATS.values() if f.claims and f.claims(file, kind)), kind)


def resolve_format(path: str, fmt: str) -> str:
    """The job's input format, with `auto` resolved from the first input file."""
    return fmt if fmt != "auto" else detect_format(input_files(path, fmt)[0], fmt)


def read_rows(
    path: str,
    fmt: str = "auto",
    batch_rows: int = 1024,
    partition_columns: bool = True,
    options: ReadOptions = ReadOptions(),
) -> Iterator[Item]:
    """Every input row (RawRow) or unparseable row (RowError), file by file, in order, each
    file cut as `options` say; each row with its file's partition columns unless
    `partition_columns` is false."""
    for file in input_files(path, fmt):
        kind = detect_format(file, fmt)
        items = input_format(kind).read(file, batch_rows, options)
        yield from with_partitions(items, partitions_of(file, path, kind, partition_columns))


def job_rows(inp: Any) -> Iterator[Item]:
    """read_rows for a job's input (`inp`: its InputConfig): its separator, its partition
    columns."""
    return read_rows(inp.path, inp.format, inp.batch_rows, inp.partition_columns, inp.read_options)


def read_file(
    file: str, inp: Any, batch_rows: int | None = None, kind: str | None = None
) -> Iterator[Item]:
    """One input file's items as the job reads them (`inp`: its InputConfig: its ReadOptions,
    its partition columns); `kind`: the file's format, where known."""
    kind = kind or detect_format(file, inp.format)
    items = input_format(kind).read(file, batch_rows or inp.batch_rows, inp.read_options)
    return iter(with_partitions(items, file_partitions(file, inp, kind)))


def file_partitions(file: str, inp: Any, kind: str | None = None) -> Values:
    """The partition columns the job's input (`inp`: its InputConfig) gives `file`'s rows;
    `kind`: the file's format, where known."""
    kind = kind or detect_format(file, inp.format)
    return partitions_of(file, inp.path, kind, inp.partition_columns)


def partitions_of(file: str, path: str, kind: str, enabled: bool = True) -> Values:
    """`file`'s partition columns under the input `path` (io/partitions.py), `kind` being its
    format; none when not `enabled`, or for a format whose preparer picks its own fields
    (OpenAI batch files)."""
    if not enabled or input_format(kind).preparer is not None:
        return {}
    return partition_values(file, path)


def check_read_options(cfg: Any) -> None:
    """input.delimiter cuts CSV files: a ConfigError (78) where the input holds none (its
    input.format names another format, or none of its files' suffixes is CSV's). In an input
    of several formats it cuts the CSV files; the others have no separator."""
    if cfg.input.delimiter is None:
        return
    kinds: dict[str, str] = {}  # format -> its first file
    for file in input_files(cfg.input.path, cfg.input.format):
        kind = detect_format(file, cfg.input.format)
        if kind == "csv":
            return
        kinds.setdefault(kind, file)
    found = ", ".join(f"{kind} ({Path(f).name})" for kind, f in kinds.items())
    where = f"{cfg.source_file}: " if cfg.source_file else ""
    raise ConfigError(
        f"{where}input.delimiter: applies to CSV input only, and the input at"
        f" {cfg.input.path} is {found}; remove input.delimiter"
    )


def make_preparer(cfg: Any, tokenizer: Any) -> Preparer:
    """The preparer for the job's input format (its own, else the column/template one)."""
    fmt = input_format(resolve_format(cfg.input.path, cfg.input.format))
    if cfg.task == "embed":
        return (fmt.embed_preparer or EmbedPreparer)(cfg, tokenizer)
    return (fmt.preparer or Preparer)(cfg, tokenizer)
