"""Formats are looked up in one registry; adding one is the recipe of DESIGN.md ("Add a
format"): a reader and a writer in a Format, registered by name. Exercised here with LTSV
(labeled tab-separated values: a row a line, `id:a<TAB>prompt:Hello`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jobrunner.config import JobConfig
from jobrunner.errors import ConfigError
from jobrunner.formats import (
    FORMATS,
    detect_format,
    input_format,
    make_preparer,
    output_format,
    read_rows,
)
from jobrunner.formats.base import Format
from jobrunner.io.readers import Item, RawRow, ReadOptions
from jobrunner.io.rundir import RunDir
from jobrunner.registry import Registry
from jobrunner.types import RowRef


def read_ltsv(file: str, batch_rows: int, options: ReadOptions = ReadOptions()) -> Iterator[Item]:
    with open(file, encoding="utf-8") as f:
        for row, line in enumerate(f):
            values = dict(field.split(":", 1) for field in line.rstrip("\n").split("\t"))
            yield RawRow(values, RowRef(file, row, line=row + 1))


def write_ltsv(records: list[dict[str, Any]], path: Path) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.writelines("\t".join(f"{k}:{v}" for k, v in r.items()) + "\n" for r in records)


LTSV = Format("ltsv", suffixes=(".ltsv",), read=read_ltsv, write=write_ltsv, suffix=".ltsv")


@pytest.fixture
def ltsv():
    FORMATS.register("ltsv", LTSV)
    yield LTSV
    FORMATS.unregister("ltsv")


def test_a_registered_format_reads_prepares_and_writes_shards(ltsv, tmp_path):
    data = tmp_path / "in.ltsv"
    data.write_text("id:a\tprompt:Hello there\nid:b\tprompt:Good night\n", encoding="utf-8")
    assert detect_format(str(data), "auto") == "ltsv"  # found by its suffix
    rows = list(read_rows(str(data)))
    assert [(r.values["id"], r.source.line) for r in rows] == [("a", 1), ("b", 2)]
    cfg = JobConfig.model_validate({"input": {"path": str(data)}})
    preparer = make_preparer(cfg, tokenizer=None)
    assert [preparer.row_id(r) for r in rows] == ["a", "b"]  # the column/template preparer

    rundir = RunDir(tmp_path / "run", output_format("ltsv").shard_format)
    m = rundir.prepare()
    rundir.commit(m, [{"id": "a", "completion": "hi", "finish_reason": "stop"}], [])
    (shard,) = rundir.shard_files()
    assert shard.name == "part-00000.ltsv"
    assert shard.read_text(encoding="utf-8") == "id:a\tcompletion:hi\tfinish_reason:stop\n"


def test_unknown_formats_name_the_known_ones():
    with pytest.raises(ConfigError, match=r"input.format: 'xml' is not one of parquet, jsonl"):
        input_format("xml")
    with pytest.raises(ConfigError, match=r"output.format: 'csv' is not one of parquet, jsonl"):
        output_format("csv")  # csv has a reader, no writer


def test_a_registry_looks_up_by_name_and_imports_lazy_entries_once():
    reg: Registry[Any] = Registry("thing", {"a": 1})
    reg.register("b", 2)

    @reg.register("c")
    def c():
        return 3

    reg.register_lazy("d", "json:dumps")
    assert reg.names() == ["a", "b", "c", "d"] and "d" in reg
    import json

    assert reg.get("d") is json.dumps and reg.get("c") is c
    with pytest.raises(ConfigError, match=r"thing: 'z' is not one of a, b, c, d"):
        reg.get("z")


def test_a_parquet_shard_of_embed_rows_that_all_failed_is_written(tmp_path):
    """A failed row has no vector: a shard holding only such rows still writes."""
    import pyarrow.parquet as pq

    from jobrunner.formats.parquet import write_parquet

    rec = {"id": "a", "embedding": None, "finish_reason": "error", "prompt_tokens": 3}
    write_parquet([rec], tmp_path / "s.parquet")
    assert pq.read_table(tmp_path / "s.parquet").column("embedding").to_pylist() == [None]
