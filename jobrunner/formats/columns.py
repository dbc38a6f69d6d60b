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
    import pyarrow as pa

    schemas, chunk = [], []
    for row in rows:
        chunk.append(row)
        if len(chunk) >= INFER_ROWS:
            schemas.append(_chunk_schema(chunk))
            chunk = []
    if chunk or not schemas:
        schemas.append(_chunk_schema(chunk))
    return unify(schemas) if len(schemas) > 1 else schemas[0] if schemas else pa.schema([])


def _chunk_schema(rows: list[dict[str, Any]]):
    import pyarrow as pa

    names = list(dict.fromkeys(k for r in rows for k in r))
    return pa.schema([_value_field(n, [r.get(n) for r in rows]) for n in names])


def _value_field(name: str, values: list[Any]):
    import pyarrow as pa

    try:
        t = pa.array(values).type
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError):
        return json_text_field(name)
    return pa.field(name, t) if storable(t) else json_text_field(name)


def unify(schemas: list) -> Any:
    """Fields by name in order of first appearance; a name typed differently takes Arrow's
    permissive common type (int32 + int64: int64, int + double: double, null + T: T, structs:
    their fields' union) where one holds every value, else JSON text."""
    import pyarrow as pa

    by_name: dict[str, list] = {}
    for s in schemas:
        for f in s:
            by_name.setdefault(f.name, []).append(f)
    return pa.schema([_common(fields) for fields in by_name.values()])


def _common(fields: list):
    import pyarrow as pa

    name = fields[0].name
    if any(is_json_text(f) for f in fields):
        return json_text_field(name)
    types = list(dict.fromkeys(f.type for f in fields))
    if len(types) == 1:
        return fields[0]
    try:
        s = pa.unify_schemas(
            [pa.schema([pa.field(name, t)]) for t in types], promote_options="permissive"
        )
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        return json_text_field(name)
    t = s.field(name).type
    return pa.field(name, t) if _holds(t, types) and storable(t) else json_text_field(name)


def _holds(common, types: list) -> bool:
    """Arrow's promotion of int64 and uint64 is int64, which cannot hold 2**63 and up."""
    import pyarrow as pa

    return not (pa.types.is_signed_integer(common) and any(pa.types.is_uint64(t) for t in types))


def storable(t, depth: int = 0) -> bool:
    """Parquet cannot store a struct without fields, nor read back very deep nesting."""
    import pyarrow as pa

    if depth > MAX_DEPTH or (pa.types.is_struct(t) and t.num_fields == 0):
        return False
    kids = [t.field(i).type for i in range(t.num_fields)] if t.num_fields else []
    if hasattr(t, "value_type"):
        kids.append(t.value_type)
    return all(storable(k, depth + 1) for k in kids)
