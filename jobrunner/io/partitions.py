"""Hive partition folders as columns: `reviews/country=de/dt=2024-01-01/part-0.parquet` under
the input root gives each of its rows `country: "de"` and `dt: "2024-01-01"`, as pandas,
pyarrow.dataset, Spark and DuckDB read a partitioned table.

Only folders below the input root count (the folder `input.path` names, a glob's fixed leading
folders, a store prefix): a file named as `input.path` itself has no partition columns, and a
folder the path spells out is the user's choice, not the table's. A value is the folder's text
URL-decoded (Hive and Spark write `%XX` escapes), always a string (no type is guessed: a `dt`
stays its text); Hive's `__HIVE_DEFAULT_PARTITION__` is null. A file holding a column named as
one of its partition keys is refused (65): a row would lose one of the two values.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterable
from typing import Any
from urllib.parse import unquote

from jobrunner.errors import InputDataError
from jobrunner.io.fs import is_remote, local_path
from jobrunner.io.readers import Item, RawRow, fixed_root, parts_below

NULL_VALUE = "__HIVE_DEFAULT_PARTITION__"  # Hive's and Spark's folder for a null key

Values = dict[str, str | None]  # partition key -> its value, in folder order


def partition_values(file: str, path: str) -> Values:
    """The `key=value` folders between the input root `path` spells and `file`."""
    path = local_path(path)
    root = fixed_root(path if is_remote(path) else os.path.expanduser(path))
    values: Values = {}
    for folder in parts_below(file, root)[:-1]:
        key, eq, value = folder.partition("=")
        if not eq or not key:
            continue  # a plain folder between partition folders: no column
        key = unquote(key)
        if key in values:
            raise InputDataError(
                f"{file}: the partition key {key!r} is given by two of its folders; a row"
                " would have two values for it. Move the file, or set"
                " input.partition_columns: false to read no columns from folders"
            )
        values[key] = None if value == NULL_VALUE else unquote(value)
    return values


def with_partitions(items: Iterable[Item], values: Values) -> Iterable[Item]:
    """`items` with `values` added to each row (RowErrors pass as they are)."""
    return (add_partitions(item, values) for item in items) if values else items


def add_partitions(item: Item, values: Values) -> Item:
    """The row with its partition columns after its own (where pyarrow.dataset puts them)."""
    if not values or not isinstance(item, RawRow):
        return item
    if not values.keys().isdisjoint(item.values):  # the row's name only for its error
        check_names(str(item.source), item.values, values)
    return RawRow({**item.values, **values}, item.source, item.exact)


def check_names(where: str, names: Collection[str], values: Values) -> None:
    """Refuse a file (or row) holding a column named as one of its partition keys (65)."""
    clash = next((k for k in values if k in names), None) if values else None
    if clash is None:
        return
    raise InputDataError(
        f"{where}: holds a column {clash!r}, which is also a partition key of its folder"
        f" ({clash}=...): a row cannot keep both values. Rename the column in the files, or set"
        " input.partition_columns: false to read no columns from folders"
    )


def with_fields(schema: Any, values: Values, file: str) -> Any:
    """A file's Arrow schema with its partition columns, strings, after its own."""
    import pyarrow as pa

    if not values:
        return schema
    check_names(file, schema.names, values)
    return pa.schema([*schema, *(pa.field(k, pa.string()) for k in values)])
