"""Column types for result shards: a schema inferred over a whole input, schemas unified, and
JSON text, the type of last resort (a column whose values share no Arrow type Parquet stores).

A JSON-text column is a string column whose field metadata says so (`JSON_TEXT`): every value
is its JSON form, so the number 5 (`5`) and the string "5" (`"5"`) stay apart.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Iterable
from typing import Any

JSON_TEXT = {b"jobrunner.encoding": b"json"}
# an inferred integer field whose values a double holds exactly (inference only; dropped by unify)
EXACT_IN_DOUBLE = {b"jobrunner.exact_in_double": b"1"}
INFER_ROWS = 4096  # rows typed together while inferring; chunk types are then unified
MAX_DEPTH = 32  # Parquet readers refuse schemas nested past 100 levels (each list is two)


def json_text_field(name: str):
    import pyarrow as pa

    return pa.field(name, pa.string(), metadata=JSON_TEXT)


def is_json_text(field) -> bool:
    return bool(field.metadata) and field.metadata.get(b"jobrunner.encoding") == b"json"


def json_default(v: Any) -> Any:
    """JSON for what json cannot write: bytes as base64 text, anything else (a Decimal, a
    date, an Arrow scalar) as its str()."""
    if isinstance(v, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(v)).decode("ascii")
    return str(v)


def json_dumps(v: Any) -> str:
    """`v` as strict JSON: NaN and +-Infinity (which JSON lacks) become null; bytes base64."""
    try:
        return json.dumps(v, ensure_ascii=False, allow_nan=False, default=json_default)
    except ValueError:  # a non-finite float somewhere in it
        return json.dumps(finite(v), ensure_ascii=False, allow_nan=False, default=json_default)


def finite(v: Any) -> Any:
    """`v` with every NaN or infinite float replaced by None."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {k: finite(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [finite(x) for x in v]
    return v


def infer_schema(rows: Iterable[dict[str, Any]]):
    """One Arrow type per key over every row (a key missing from a row is null there): each
    chunk of rows typed by pyarrow, chunks unified; values sharing no type: JSON text."""
    inference = SchemaInference()
    for row in rows:
        inference.add(row)
    return inference.schema()


class SchemaInference:
    """infer_schema a row at a time (`add`), for a pass that reads the rows anyway (the input
    scan): a chunk of INFER_ROWS rows is typed when it fills and then let go; the distinct
    chunk schemas (metadata included: unify reads it) are unified at the end, all at once."""

    def __init__(self) -> None:
        self._chunk: list[dict[str, Any]] = []
        self._typed: dict[tuple, Any] = {}  # chunks of a file mostly type alike: a few kept

    def add(self, row: dict[str, Any]) -> None:
        self._chunk.append(row)
        if len(self._chunk) >= INFER_ROWS:
            self._type_chunk()

    def schema(self) -> Any:
        if self._chunk or not self._typed:
            self._type_chunk()
        return unify(list(self._typed.values()))

    def _type_chunk(self) -> None:
        typed = _chunk_schema(self._chunk)
        key = tuple((f.name, str(f.type), tuple(sorted((f.metadata or {}).items()))) for f in typed)
        self._typed.setdefault(key, typed)
        self._chunk = []


def _chunk_schema(rows: list[dict[str, Any]]):
    import pyarrow as pa

    names = list(dict.fromkeys(k for r in rows for k in r))
    return pa.schema([_value_field(n, [r.get(n) for r in rows]) for n in names])


def _value_field(name: str, values: list[Any]):
    import pyarrow as pa

    try:
        arr = pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError):
        return json_text_field(name)
    if not storable(arr.type):
        return json_text_field(name)
    return pa.field(name, arr.type, metadata=EXACT_IN_DOUBLE if _exact_in_double(arr) else None)


def _exact_in_double(arr) -> bool:
    """Integers a double holds exactly (|v| <= 2**53): such a chunk may join a float one."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not pa.types.is_integer(arr.type):
        return False
    low, high = (pc.min_max(arr)[k].as_py() for k in ("min", "max"))
    return low is None or (low >= -(2**53) and high <= 2**53)


def unify(schemas: list) -> Any:
    """Fields by name in order of first appearance; a name typed differently takes Arrow's
    permissive common type (int32 + int64: int64, int + double: double, null + T: T, structs:
    their fields' union) where one holds every value, else JSON text."""
    import pyarrow as pa

    by_name: dict[str, list] = {}
    for s in schemas:
        for f in s:
            by_name.setdefault(f.name, []).append(f.with_type(_plain(f.type)))
    return pa.schema([_common(fields) for fields in by_name.values()])


def _plain(t):
    """A dictionary type as its values' type: a shard gathers rows of several files, whose
    dictionaries together may outgrow one file's index type (pandas' Categorical: int8)."""
    import pyarrow as pa

    return t.value_type if pa.types.is_dictionary(t) else t


def _common(fields: list):
    import pyarrow as pa

    name = fields[0].name
    if any(is_json_text(f) for f in fields):
        return json_text_field(name)
    types = list(dict.fromkeys(f.type for f in fields))
    if len(types) == 1:
        return pa.field(name, types[0])
    try:
        s = pa.unify_schemas(
            [pa.schema([pa.field(name, t)]) for t in types], promote_options="permissive"
        )
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        return json_text_field(name)
    t = s.field(name).type
    lossless = all(_holds(t, f.type, f.metadata == EXACT_IN_DOUBLE) for f in fields)
    return pa.field(name, t) if lossless and storable(t) else json_text_field(name)


def _holds(common, t, exact_in_double: bool = False) -> bool:
    """Whether every value of type `t` converts to `common` exactly, nested types field by
    field: not integers into a float (past 2**53 they round) unless the values were seen to
    fit, nor uint64 into a signed integer (2**63 and up)."""
    import pyarrow as pa

    if pa.types.is_integer(t) and pa.types.is_floating(common):  # mantissa: 53 or 24 bits
        return exact_in_double or t.bit_width <= (32 if pa.types.is_float64(common) else 16)
    if pa.types.is_uint64(t) and pa.types.is_signed_integer(common):
        return False
    if pa.types.is_struct(t) and pa.types.is_struct(common):
        inner = {common.field(i).name: common.field(i).type for i in range(common.num_fields)}
        kids = [(inner.get(t.field(i).name), t.field(i).type) for i in range(t.num_fields)]
        return all(c is None or _holds(c, k) for c, k in kids)
    if hasattr(t, "value_type") and hasattr(common, "value_type"):
        return _holds(common.value_type, t.value_type)
    return True


def storable(t, depth: int = 0) -> bool:
    """Parquet cannot store a struct without fields, nor read back very deep nesting."""
    import pyarrow as pa

    if depth > MAX_DEPTH or (pa.types.is_struct(t) and t.num_fields == 0):
        return False
    kids = [t.field(i).type for i in range(t.num_fields)] if t.num_fields else []
    if hasattr(t, "value_type"):
        kids.append(t.value_type)
    return all(storable(k, depth + 1) for k in kids)
