"""Avro schemas as Iceberg types: what a typed table's value columns are.

    record                    → struct (its fields at the top level of the table when it is the value)
    ["null", T] / [T, "null"] → T, optional (any other field is required)
    boolean int long float double bytes string → boolean int long float double binary string
    enum → string (the symbol)        fixed(n) → fixed[n]
    array<T> → list<T>                map<T> → map<string, T>
    date → date                       time-millis / time-micros → time
    timestamp-millis / -micros → timestamptz (Avro's are UTC instants)
    local-timestamp-millis / -micros → timestamp      decimal(p, s) on bytes or fixed → decimal(p, s)
    uuid → string (its canonical text)

Values are read with the logical types other than decimal removed (`plain_avro`): dates, times and timestamps as
their numbers, turned into Arrow's types by one cast per batch (`arrow_raw_type`).

Unions of two or more non-null types and recursive records have no Iceberg type: `UnsupportedSchema` (the records of
such a schema go to the dead-letter table with that reason).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterator
from typing import Any


class UnsupportedSchema(ValueError):
    """The Avro schema has a construct with no Iceberg type (the message says which)."""


def parse_avro(text: str) -> Any:
    """The registered schema's JSON with named types expanded where they are referenced (what fastavro reads)."""
    import fastavro

    try:
        return fastavro.parse_schema(json.loads(text), expand=True, _write_hint=False)
    except (ValueError, TypeError, KeyError, fastavro.schema.SchemaParseException) as exc:
        raise UnsupportedSchema(f"not a valid Avro schema: {exc}") from None


def value_fields(avro: Any) -> list[Any]:
    """The table's value columns (pyiceberg NestedFields, ids to be assigned by the table): a record's fields, or one
    `value` column for any other schema."""
    from pyiceberg.types import NestedField

    ids = itertools.count(1)  # placeholder field ids (the table assigns its own)
    if isinstance(avro, dict) and avro.get("type") == "record":
        return [_field(f["name"], f["type"], ids, ()) for f in avro["fields"]]
    t, optional = _unwrap(avro)
    return [NestedField(next(ids), "value", _type(t, ids, ()), required=not optional)]


def _unwrap(avro: Any) -> tuple[Any, bool]:
    """(the type, optional) for a union with null; the type itself otherwise."""
    if isinstance(avro, list):
        rest = [b for b in avro if b != "null"]
        if len(rest) != 1:
            raise UnsupportedSchema(f"a union of {len(rest)} non-null types ({_names(rest)}) has no Iceberg type")
        return rest[0], len(rest) != len(avro)
    return avro, False


def _field(name: str, avro: Any, ids: Iterator[int], seen: tuple[str, ...]) -> Any:
    from pyiceberg.types import NestedField

    t, optional = _unwrap(avro)
    fid = next(ids)
    return NestedField(fid, name, _type(t, ids, seen), required=not optional)


def _type(avro: Any, ids: Iterator[int], seen: tuple[str, ...]) -> Any:
    from pyiceberg import types as it

    if isinstance(avro, list):
        t, _ = _unwrap(avro)
        return _type(t, ids, seen)
    if isinstance(avro, str):
        avro = {"type": avro}
    kind, logical = avro.get("type"), avro.get("logicalType")
    if isinstance(kind, (dict, list)):
        return _type(kind, ids, seen)
    if logical == "decimal" and kind in ("bytes", "fixed"):
        return it.DecimalType(int(avro["precision"]), int(avro.get("scale", 0)))
    logical_types = {("int", "date"): it.DateType(), ("int", "time-millis"): it.TimeType(),
                     ("long", "time-micros"): it.TimeType(), ("long", "timestamp-millis"): it.TimestamptzType(),
                     ("long", "timestamp-micros"): it.TimestamptzType(),
                     ("long", "local-timestamp-millis"): it.TimestampType(),
                     ("long", "local-timestamp-micros"): it.TimestampType(), ("string", "uuid"): it.StringType()}
    if (kind, logical) in logical_types:
        return logical_types[(kind, logical)]
    simple = {"boolean": it.BooleanType(), "int": it.IntegerType(), "long": it.LongType(), "float": it.FloatType(),
              "double": it.DoubleType(), "bytes": it.BinaryType(), "string": it.StringType(),
              "enum": it.StringType()}
    if kind in simple:
        return simple[kind]
    if kind == "fixed":
        return it.FixedType(int(avro["size"]))
    if kind == "array":
        t, optional = _unwrap(avro["items"])
        eid = next(ids)
        return it.ListType(eid, _type(t, ids, seen), element_required=not optional)
    if kind == "map":
        t, optional = _unwrap(avro["values"])
        kid, vid = next(ids), next(ids)
        return it.MapType(kid, it.StringType(), vid, _type(t, ids, seen), value_required=not optional)
    if kind == "record":
        name = avro.get("name", "")
        if name in seen:
            raise UnsupportedSchema(f"record {name} contains itself (a recursive type has no Iceberg type)")
        return it.StructType(*(_field(f["name"], f["type"], ids, (*seen, name)) for f in avro["fields"]))
    raise UnsupportedSchema(f"Avro type {kind!r} has no Iceberg type (a record referring to itself is recursive)")


def _names(branches: list[Any]) -> str:
    return ", ".join(b if isinstance(b, str) else str(b.get("name") or b.get("type")) for b in branches)


_MILLIS = ("timestamp-millis", "local-timestamp-millis", "time-millis")


def plain_avro(avro: Any) -> Any:
    """The schema as fastavro should read it: logical types other than decimal removed, so timestamps, dates and
    times come out as the numbers they are (Arrow turns them into its types in one cast per batch, far cheaper than
    a Python datetime per value) and uuids as their text."""
    if isinstance(avro, list):
        return [plain_avro(b) for b in avro]
    if not isinstance(avro, dict):
        return avro
    out = {k: plain_avro(v) if k in ("type", "items", "values") else v for k, v in avro.items()
           if not (k == "logicalType" and v != "decimal")}
    if "fields" in avro:
        out["fields"] = [{**f, "type": plain_avro(f["type"])} for f in avro["fields"]]
    return out


def python_fixer(avro: Any) -> Callable[[Any], Any] | None:
    """What turns a value read with `plain_avro` into the numbers the Arrow columns take (millisecond timestamps and
    times into microseconds), or None when every value goes as read (no walk over each record)."""
    return _fixer(avro)


def _fixer(avro: Any) -> Callable[[Any], Any] | None:
    """None: the value goes as read; else a function making it right (records changed in place)."""
    if isinstance(avro, list):
        subs = [_fixer(b) for b in avro if b != "null"]
        one = subs[0] if len(subs) == 1 else None
        return None if one is None else (lambda v: None if v is None else one(v))
    if isinstance(avro, str):
        return None
    kind = avro.get("type")
    if isinstance(kind, (dict, list)):
        return _fixer(kind)
    if avro.get("logicalType") in _MILLIS:
        return lambda v: v * 1000
    if kind == "record":
        fields = [(f["name"], fx) for f in avro["fields"] if (fx := _fixer(f["type"])) is not None]
        if not fields:
            return None

        def record(v: Any) -> Any:
            for name, fx in fields:
                v[name] = fx(v[name])
            return v
        return record
    if kind == "array":
        item = _fixer(avro["items"])
        return None if item is None else (lambda v: [None if x is None else item(x) for x in v])
    if kind == "map":
        value = _fixer(avro["values"])
        return None if value is None else (lambda v: {k: None if x is None else value(x) for k, x in v.items()})
    return None
