"""JSON Schema values as Iceberg columns, and a JSON document as a row's columns, checked against its schema.

    object with properties      → struct (its properties at the top level of the table when it is the value)
    object with only additionalProperties: S → map<string, S>
    string → string (format date-time → timestamptz, date → date)
    integer → long          number → double          boolean → boolean          array of S → list<S>
    a property in `required` → a required column; others, and types listing "null", optional

`$ref`, `oneOf`, `anyOf`, `allOf` and type lists of two or more non-null types have no Iceberg type here
(`UnsupportedSchema`). Properties a document has and its schema does not declare are not columns.
"""

from __future__ import annotations

import datetime
import itertools
import json
from collections.abc import Callable, Iterator
from typing import Any

from tierproxy.jobs.iceberg.avro_types import UnsupportedSchema

Convert = Callable[[Any, str], Any]  # (value, path) → the column's value; ValueError naming the path


def parse_json_schema(text: str) -> dict[str, Any]:
    try:
        schema = json.loads(text)
    except ValueError as exc:
        raise UnsupportedSchema(f"not JSON: {exc}") from None
    if not isinstance(schema, dict):
        raise UnsupportedSchema("a JSON Schema is an object")
    return schema


def json_value_fields(schema: dict[str, Any]) -> list[Any]:
    """The table's value columns for a JSON Schema (placeholder ids): an object's properties, or one `value`."""
    from pyiceberg.types import NestedField

    ids = itertools.count(1)  # placeholder field ids (the table assigns its own)
    t, optional = _unwrap(schema)
    if t == "object" and "properties" in schema:
        return _properties(schema, ids)
    return [NestedField(next(ids), "value", _type(schema, ids), required=not optional)]


def _unwrap(schema: dict[str, Any]) -> tuple[str, bool]:
    for bad in ("$ref", "oneOf", "anyOf", "allOf"):
        if bad in schema:
            raise UnsupportedSchema(f"{bad} has no Iceberg type here")
    t = schema.get("type")
    if isinstance(t, list):
        rest = [x for x in t if x != "null"]
        if len(rest) != 1:
            raise UnsupportedSchema(f"a type of {len(rest)} non-null types ({', '.join(rest)}) has no Iceberg type")
        return str(rest[0]), len(rest) != len(t)
    if not isinstance(t, str):
        raise UnsupportedSchema(f"no type in {json.dumps(schema)[:80]}")
    return t, False


def _properties(schema: dict[str, Any], ids: Iterator[int]) -> list[Any]:
    from pyiceberg.types import NestedField

    required = set(schema.get("required", []))
    out = []
    for name, sub in schema["properties"].items():
        _, nullable = _unwrap(sub)
        fid = next(ids)
        out.append(NestedField(fid, name, _type(sub, ids), required=name in required and not nullable))
    return out


def _type(schema: dict[str, Any], ids: Iterator[int]) -> Any:
    from pyiceberg import types as it

    t, _ = _unwrap(schema)
    if t == "string":
        return {"date-time": it.TimestamptzType(), "date": it.DateType()}.get(schema.get("format", ""),
                                                                               it.StringType())
    simple = {"integer": it.LongType(), "number": it.DoubleType(), "boolean": it.BooleanType()}
    if t in simple:
        return simple[t]
    if t == "array":
        items = schema.get("items")
        if not isinstance(items, dict):
            raise UnsupportedSchema("an array without one items schema has no Iceberg type")
        _, nullable = _unwrap(items)
        return it.ListType(next(ids), _type(items, ids), element_required=not nullable)
    if t == "object":
        if "properties" in schema:
            return it.StructType(*_properties(schema, ids))
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            _, nullable = _unwrap(extra)
            kid, vid = next(ids), next(ids)
            return it.MapType(kid, it.StringType(), vid, _type(extra, ids), value_required=not nullable)
        raise UnsupportedSchema("an object with neither properties nor an additionalProperties schema")
    raise UnsupportedSchema(f"JSON type {t!r} has no Iceberg type")


def json_converter(fields: list[Any], record: bool) -> Callable[[Any], dict[str, Any]]:
    """A parsed document → the row's value columns, each checked against its column (ValueError naming the first
    property that does not match); date-times as microseconds and dates as days since the epoch (Arrow's raw types
    for them: `typed.arrow_raw_type`)."""
    from pyiceberg.types import StructType

    struct = _convert(StructType(*fields))
    if record:
        return lambda doc: struct(doc, "")
    single = _convert(fields[0].field_type)
    required = fields[0].required

    def one(doc: Any) -> dict[str, Any]:
        if doc is None and required:
            raise ValueError("value is null, its column is required")
        return {"value": None if doc is None else single(doc, "value")}
    return one


def _convert(t: Any) -> Convert:
    from pyiceberg import types as it

    def check(ok: Callable[[Any], bool], what: str, then: Callable[[Any], Any] = lambda v: v) -> Convert:
        def conv(v: Any, path: str) -> Any:
            if not ok(v):
                raise ValueError(f"{path or 'value'} is {json.dumps(v)[:40]}, not {what}")
            return then(v)
        return conv

    if isinstance(t, it.StructType):
        subs = [(f.name, f.required, _convert(f.field_type)) for f in t.fields]

        def struct(v: Any, path: str) -> Any:
            if not isinstance(v, dict):
                raise ValueError(f"{path or 'value'} is not an object")
            out: dict[str, Any] = {}
            for name, required, conv in subs:
                x, at = v.get(name), f"{path}.{name}" if path else name
                if x is None:
                    if required:
                        raise ValueError(f"{at} is required and missing or null")
                    out[name] = None
                else:
                    out[name] = conv(x, at)
            return out
        return struct
    if isinstance(t, it.ListType):
        item = _convert(t.element_type)

        def array(v: Any, path: str) -> Any:
            if not isinstance(v, list):
                raise ValueError(f"{path or 'value'} is {json.dumps(v)[:40]}, not an array")
            return [None if x is None else item(x, f"{path}[{i}]") for i, x in enumerate(v)]
        return array
    if isinstance(t, it.MapType):
        value = _convert(t.value_type)

        def mapping(v: Any, path: str) -> Any:
            if not isinstance(v, dict):
                raise ValueError(f"{path or 'value'} is {json.dumps(v)[:40]}, not an object")
            return {k: None if x is None else value(x, f"{path}.{k}") for k, x in v.items()}
        return mapping
    if isinstance(t, it.LongType):
        return check(lambda v: isinstance(v, int) and not isinstance(v, bool) and -2**63 <= v < 2**63, "an integer")
    if isinstance(t, it.DoubleType):
        return check(lambda v: isinstance(v, (int, float)) and not isinstance(v, bool), "a number", float)
    if isinstance(t, it.BooleanType):
        return check(lambda v: isinstance(v, bool), "a boolean")
    if isinstance(t, it.TimestamptzType):
        return check(lambda v: isinstance(v, str) and _instant(v) is not None, "a date-time with an offset",
                     _instant)
    if isinstance(t, it.DateType):
        return check(lambda v: isinstance(v, str) and _date(v) is not None, "a date", _date)
    return check(lambda v: isinstance(v, str), "a string")


_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_MICRO = datetime.timedelta(microseconds=1)


def _instant(v: str) -> int | None:
    """A date-time with an offset as microseconds since the epoch (what the column's raw Arrow type holds)."""
    try:
        d = datetime.datetime.fromisoformat(v)
    except ValueError:
        return None
    return (d - _EPOCH) // _MICRO if d.tzinfo is not None else None


def _date(v: str) -> int | None:
    """A date as days since the epoch."""
    try:
        return (datetime.date.fromisoformat(v) - _EPOCH.date()).days
    except ValueError:
        return None
