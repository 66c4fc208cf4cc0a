"""The compiled Avro loop against fastavro: for flat records, `ValueDecoder.decode_batch` (the loop, fastavro for
what it hands back) gives the same rows, the same dead letters and the same reasons as decoding every value with
fastavro (`ValueDecoder.decode`), over generated schemas, records and damaged bytes."""

from __future__ import annotations

import io
import json
import math
import struct
from typing import Any

import fastavro
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tierproxy.jobs.iceberg.avro_kernel import AvroProgram
from tierproxy.jobs.iceberg.typed import (
    DecodePlan,
    ValueDecoder,
    arrow_raw_type,
    schema_fields,
    typed_schema,
    value_columns,
)

# (Avro type, a strategy of its values)
_KINDS: dict[str, tuple[Any, Any]] = {
    "boolean": ("boolean", st.booleans()),
    "int": ("int", st.integers(-(1 << 31), (1 << 31) - 1)),
    "long": ("long", st.integers(-(1 << 63), (1 << 63) - 1)),
    "float": ("float", st.floats(width=32, allow_nan=False)),
    "double": ("double", st.floats(allow_nan=False)),
    "string": ("string", st.text(max_size=12)),
    "bytes": ("bytes", st.binary(max_size=12)),
    "enum": ({"type": "enum", "name": "Colour", "symbols": ["RED", "GREEN", "BLUE"]},
             st.sampled_from(["RED", "GREEN", "BLUE"])),
    "date": ({"type": "int", "logicalType": "date"}, st.integers(-100_000, 100_000)),
    "time-millis": ({"type": "int", "logicalType": "time-millis"}, st.integers(0, 86_399_999)),
    "timestamp-millis": ({"type": "long", "logicalType": "timestamp-millis"},
                         st.integers(-(1 << 40), 1 << 42)),
    "timestamp-micros": ({"type": "long", "logicalType": "timestamp-micros"}, st.integers(0, 1 << 52)),
    "uuid": ({"type": "string", "logicalType": "uuid"}, st.uuids().map(str)),
    "array<string>": ({"type": "array", "items": "string"}, st.lists(st.text(max_size=5), max_size=4)),
    "array<long?>": ({"type": "array", "items": ["null", "long"]},
                    st.lists(st.none() | st.integers(-(1 << 63), (1 << 63) - 1), max_size=4)),
    "array<timestamp-millis>": ({"type": "array", "items": {"type": "long", "logicalType": "timestamp-millis"}},
                                st.lists(st.integers(0, 1 << 42), max_size=3)),
    "array<double>": ({"type": "array", "items": "double"}, st.lists(st.floats(allow_nan=False), max_size=3)),
}
_SCHEMA_ID = 11


def _target(columns: list[Any]) -> Any:
    """The raw Arrow struct of a table's value columns, as split_batch asks for it."""
    from pyiceberg.io.pyarrow import schema_to_pyarrow

    arrow = schema_to_pyarrow(typed_schema(columns))
    names = [f.name for f in columns]
    return arrow_raw_type(pa.struct([arrow.field(n) for n in names]))


def _decoder(text: str, record: bool = True, columns: list[Any] | None = None) -> tuple[ValueDecoder, Any]:
    plan = DecodePlan(None, {_SCHEMA_ID: ("AVRO", text)}, {}, record)
    table = value_columns(typed_schema(columns or schema_fields("AVRO", text)))
    return ValueDecoder(plan, table), _target(table)


def _encode(schema: Any, value: Any, schema_id: int = _SCHEMA_ID) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), value)
    return struct.pack(">bI", 0, schema_id) + out.getvalue()


def _one_by_one(decoder: ValueDecoder, values: list[bytes | None], target: Any) -> tuple[Any, ...]:
    ok, rows, dead, reasons = [], [], [], []
    for i, v in enumerate(values):
        columns, reason = decoder.decode(v)
        if columns is None:
            dead.append(i)
            reasons.append(reason)
        else:
            ok.append(i)
            rows.append(columns)
    try:
        return ok, pa.array(rows, type=target), dead, reasons
    except (pa.ArrowInvalid, OverflowError):  # an int past 32 bits that fastavro read: a dead letter
        ok, built = ValueDecoder._unfit(ok, rows, target, dead, reasons)
        return ok, built, dead, reasons


def _same(text: str, values: list[bytes | None], record: bool = True, columns: list[Any] | None = None) -> Any:
    decoder, target = _decoder(text, record, columns)
    ok, arr, dead, reasons = decoder.decode_batch(pa.array(values, pa.binary()), target)
    want_ok, want, want_dead, want_reasons = _one_by_one(_decoder(text, record, columns)[0], values, target)
    assert list(ok) == want_ok
    assert (dead, reasons) == (want_dead, want_reasons)
    assert arr.type == want.type
    assert _comparable(arr.to_pylist()) == _comparable(want.to_pylist())  # (a NaN equals no NaN in Arrow's equals)
    return arr


def _comparable(value: Any) -> Any:
    """Values with NaN spelled out, so that a NaN both paths decoded compares equal."""
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    if isinstance(value, list):
        return [_comparable(v) for v in value]
    if isinstance(value, dict):
        return {k: _comparable(v) for k, v in value.items()}
    return value


@st.composite
def _records(draw: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    kinds = draw(st.lists(st.sampled_from(sorted(_KINDS)), min_size=1, max_size=6))
    fields, values = [], []
    for i, kind in enumerate(kinds):
        avro, strategy = _KINDS[kind]
        nullable = draw(st.sampled_from([None, 0, 1]))  # no union, ["null", T], [T, "null"]
        if kind == "enum":
            avro = {**avro, "name": f"Colour{i}"}
        typ = avro if nullable is None else (["null", avro] if nullable == 0 else [avro, "null"])
        fields.append({"name": f"f{i}", "type": typ})
        values.append(strategy if nullable is None else st.none() | strategy)
    schema = {"type": "record", "name": "R", "fields": fields}
    rows = draw(st.lists(st.fixed_dictionaries({f["name"]: v for f, v in zip(fields, values, strict=True)}),
                         min_size=1, max_size=8))
    return schema, rows


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_records(), st.lists(st.tuples(st.integers(0, 7), st.sampled_from(["cut", "extra", "flip", "magic"]),
                                      st.integers(0, 255)), max_size=4))
def test_the_loop_decodes_as_fastavro_does(generated: Any, damage: list[tuple[int, str, int]]) -> None:
    schema, rows = generated
    values: list[bytes | None] = [_encode(schema, r) for r in rows]
    for row, how, byte in damage:  # damaged values: dead letters (or other values) alike on both paths
        v = values[row % len(values)]
        assert v is not None
        if how == "cut":
            v = v[:max(5, len(v) - 1 - byte % 4)]
        elif how == "extra":
            v = v + bytes([byte])
        elif how == "flip" and len(v) > 5:
            at = 5 + byte % (len(v) - 5)
            v = v[:at] + bytes([v[at] ^ 0xFF]) + v[at + 1:]
        elif how == "magic":
            v = bytes([1]) + v[1:]
        values[row % len(values)] = v
    _same(json.dumps(schema), [*values, None])


def test_mixed_versions_keep_the_offset_order_and_evolved_columns() -> None:
    """Two versions in one batch (v1: an int `n`; v2: `n` long and a new field), a version the loop does not take
    (a nested record, read by fastavro) and garbage between them: rows in their order, v1's rows null in the new
    column, v1's int widened."""
    v1 = {"type": "record", "name": "R", "fields": [{"name": "id", "type": "string"}, {"name": "n", "type": "int"}]}
    v2 = {"type": "record", "name": "R", "fields": [{"name": "id", "type": "string"}, {"name": "n", "type": "long"},
                                                    {"name": "note", "type": ["null", "string"], "default": None}]}
    nested = {"type": "record", "name": "R", "fields": [
        {"name": "id", "type": "string"},
        {"name": "inner", "type": ["null", {"type": "record", "name": "I", "fields": [{"name": "x", "type": "int"}]}]}]}
    assert AvroProgram.of(json.dumps(v1), True) is not None
    assert AvroProgram.of(json.dumps(nested), True) is None
    columns = [*schema_fields("AVRO", json.dumps(v2)), schema_fields("AVRO", json.dumps(nested))[1]]
    plan = DecodePlan(None, {1: ("AVRO", json.dumps(v1)), 2: ("AVRO", json.dumps(v2)), 3: ("AVRO", json.dumps(nested))},
                      {}, True)
    table = value_columns(typed_schema(columns))
    target = _target(table)
    values: list[bytes | None] = []
    for i in range(30):
        kind = i % 4
        if kind == 0:
            values.append(_encode(v1, {"id": f"a{i}", "n": i}, 1))
        elif kind == 1:
            values.append(_encode(v2, {"id": f"b{i}", "n": 1 << 40, "note": None if i % 3 else "x"}, 2))
        elif kind == 2:
            values.append(_encode(nested, {"id": f"c{i}", "inner": {"x": i}}, 3))
        else:
            values.append(b"\x00\x00\x00\x00\x01garbage")
    ok, arr, dead, reasons = ValueDecoder(plan, table).decode_batch(pa.array(values, pa.binary()), target)
    want_ok, want, want_dead, want_reasons = _one_by_one(ValueDecoder(plan, table), values, target)
    assert list(ok) == want_ok == [i for i in range(30) if i % 4 != 3]
    assert (dead, reasons) == (want_dead, want_reasons)
    assert arr.equals(want)
    rows = arr.to_pylist()
    assert rows[0] == {"id": "a0", "n": 0, "note": None, "inner": None}
    assert rows[1] == {"id": "b1", "n": 1 << 40, "note": None, "inner": None}
    assert rows[2] == {"id": "c2", "n": None, "note": None, "inner": {"x": 2}}


@pytest.mark.parametrize(("schema", "record", "compiled"), [
    ({"type": "record", "name": "R", "fields": [{"name": "a", "type": "long"}]}, True, True),
    ("string", False, True),
    (["null", "long"], False, True),
    ({"type": "record", "name": "R", "fields": [{"name": "a", "type": "long"}]}, False, False),
    ("string", True, False),
    ({"type": "record", "name": "R", "fields": [{"name": "a", "type": {"type": "array", "items": "int"}}]}, True,
     True),
    ({"type": "record", "name": "R", "fields": [{"name": "a", "type": {
        "type": "array", "items": {"type": "array", "items": "int"}}}]}, True, False),
    ({"type": "record", "name": "R", "fields": [{"name": "a", "type": {"type": "map", "values": "int"}}]}, True,
     False),
    ({"type": "record", "name": "R", "fields": [
        {"name": "a", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}}]}, True, False),
    ({"type": "record", "name": "R", "fields": [{"name": "a", "type": {"type": "fixed", "name": "F", "size": 4}}]},
     True, False),
    ({"type": "record", "name": "R", "fields": [{"name": "a", "type": ["null", "int", "string"]}]}, True, False),
])
def test_which_schemas_the_loop_reads(schema: Any, record: bool, compiled: bool) -> None:
    """Flat records of primitives, enums and the number logical types, or one such value; anything else is read by
    fastavro."""
    assert (AvroProgram.of(json.dumps(schema), record) is not None) is compiled


def test_a_value_of_one_type_and_strings_that_are_not_utf8() -> None:
    """A schema that is one string: its values in the `value` column; a value whose bytes are not UTF-8 is a dead
    letter with fastavro's reason, the other rows still decode."""
    good = [_encode("string", f"v{i}") for i in range(10)]
    bad = struct.pack(">bI", 0, _SCHEMA_ID) + b"\x04\xff\xfe"
    arr = _same(json.dumps("string"), [*good[:5], bad, *good[5:]], record=False)
    assert arr.field("value").to_pylist() == [f"v{i}" for i in range(10)]


def test_arrays_in_blocks_with_their_sizes_and_counts_that_lie() -> None:
    """An array written in blocks of a negative count and a byte size (as Java's encoder may), and arrays whose count
    promises more items than the value has bytes: the same rows and reasons as fastavro."""
    schema = {"type": "record", "name": "R", "fields": [{"name": "tags", "type": {"type": "array", "items": "string"}},
                                                        {"name": "n", "type": "int"}]}
    header = struct.pack(">bI", 0, _SCHEMA_ID)
    blocked = header + b"\x03\x0a" + b"\x02a\x04bc" + b"\x02" + b"\x04de" + b"\x00" + b"\x54"  # [a, bc], [de]; 42
    lying = header + b"\xfe\xff\xff\xff\x0f" + b"\x02a" + b"\x00" + b"\x54"  # 2^31 - 1 items promised
    arr = _same(json.dumps(schema), [blocked, lying, _encode(schema, {"tags": ["x"], "n": 7})])
    assert arr.to_pylist() == [{"tags": ["a", "bc", "de"], "n": 42}, {"tags": ["x"], "n": 7}]


def test_an_int_past_32_bits_is_a_dead_letter_not_a_failed_pass() -> None:
    """fastavro reads an `int` varint past 32 bits without a check (Avro's int is 32-bit); its column cannot hold
    it: that record is a dead letter, the others in the batch rows."""
    schema = {"type": "record", "name": "R", "fields": [{"name": "n", "type": "int"}]}
    big = struct.pack(">bI", 0, _SCHEMA_ID) + b"\x80\x80\x80\x80\x20"  # 2^32, zigzag varint
    values: list[bytes | None] = [_encode(schema, {"n": 1}), big, _encode(schema, {"n": -3})]
    decoder, target = _decoder(json.dumps(schema))
    ok, arr, dead, reasons = decoder.decode_batch(pa.array(values, pa.binary()), target)
    assert list(ok) == [0, 2] and arr.field("n").to_pylist() == [1, -3]
    assert dead == [1] and "does not fit its column" in reasons[0], reasons
