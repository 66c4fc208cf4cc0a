"""The typed tables' rules on their own: Avro schemas as Iceberg columns, which version changes evolve a table and
which are incompatible, and a value's bytes → its columns or the reason it is a dead letter (never an exception)."""

from __future__ import annotations

import datetime
import decimal
import io
import json
import struct
from typing import Any

import fastavro
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyiceberg.io.pyarrow import schema_to_pyarrow

from tierproxy.config.values import typed_table_name, typed_table_rules
from tierproxy.jobs.iceberg.avro_types import UnsupportedSchema, parse_avro, plain_avro, value_fields
from tierproxy.jobs.iceberg.evolution import change_reason, evolve, fits_reason
from tierproxy.jobs.iceberg.registry import RegistryConfig
from tierproxy.jobs.iceberg.schema import iceberg_schema
from tierproxy.jobs.iceberg.typed import (
    DecodePlan,
    ValueDecoder,
    dlq_schema,
    plain_fields,
    schema_fields,
    typed_schema,
    value_columns,
)
from tierproxy.jobs.iceberg.typed_files import split_batch

ORDER = {"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "id", "type": "long"},
    {"name": "item", "type": "string"},
    {"name": "qty", "type": "int"},
    {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}},
    {"name": "ref", "type": {"type": "string", "logicalType": "uuid"}},
    {"name": "tags", "type": {"type": "array", "items": "string"}},
    {"name": "counts", "type": {"type": "map", "values": "long"}},
    {"name": "state", "type": {"type": "enum", "name": "State", "symbols": ["NEW", "PAID"]}},
    {"name": "day", "type": {"type": "int", "logicalType": "date"}},
    {"name": "ship", "type": ["null", {"type": "record", "name": "Ship", "fields": [
        {"name": "city", "type": "string"}, {"name": "zip", "type": ["null", "string"]}]}], "default": None},
]}
ROW = {"id": 7, "item": "tea", "qty": 3, "at": datetime.datetime(2024, 5, 1, 12, tzinfo=datetime.UTC),
       "price": decimal.Decimal("12.50"), "ref": "1b4e28ba-2fa1-11d2-883f-0016d3cca427", "tags": ["hot"],
       "counts": {"a": 1}, "state": "PAID", "day": datetime.date(2024, 5, 1), "ship": {"city": "Oslo", "zip": None}}


# ROW as the decoder hands it to Arrow: timestamps in microseconds, dates in days (one cast per batch makes them
# Arrow's timestamp and date)
RAW_ROW = {**ROW, "at": 1714564800 * 10**6, "day": 19844}


def _version(change: Any) -> dict[str, Any]:
    v = json.loads(json.dumps(ORDER))
    change(v["fields"])
    return v


def _fields(avro: dict[str, Any]) -> list[Any]:
    return value_fields(parse_avro(json.dumps(avro)))


def _kinds(fields: list[Any]) -> dict[str, tuple[str, bool]]:
    return {f.name: (str(f.field_type).split(":")[-1].strip() if "struct" not in str(f.field_type) else "struct",
                     f.required) for f in fields}


def test_avro_types_map_to_iceberg_columns() -> None:
    kinds = _kinds(_fields(ORDER))
    assert kinds == {"id": ("long", True), "item": ("string", True), "qty": ("int", True),
                     "at": ("timestamptz", True), "price": ("decimal(9, 2)", True), "ref": ("string", True),
                     "tags": ("list<string>", True), "counts": ("map<string, long>", True),
                     "state": ("string", True), "day": ("date", True), "ship": ("struct", False)}
    schema = typed_schema(_fields(ORDER))
    assert [f.name for f in schema.fields][-10:][0] == "_kafka_topic"
    assert [f.name for f in value_columns(schema)] == [f["name"] for f in ORDER["fields"]]


@pytest.mark.parametrize("avro", [
    {"type": "record", "name": "N", "fields": [{"name": "next", "type": ["null", "N"]}]},  # recursive
    {"type": "record", "name": "U", "fields": [{"name": "x", "type": ["int", "string"]}]},  # a real union
])
def test_schemas_without_an_iceberg_type_are_refused_with_the_reason(avro: dict[str, Any]) -> None:
    with pytest.raises(UnsupportedSchema):
        _fields(avro)


def test_a_value_field_named_like_a_kafka_column_is_refused() -> None:
    with pytest.raises(UnsupportedSchema, match="_kafka_"):
        typed_schema(_fields({"type": "record", "name": "R", "fields": [{"name": "_kafka_offset", "type": "long"}]}))


@pytest.mark.parametrize(("change", "why"), [
    (lambda f: f.append({"name": "note", "type": ["null", "string"], "default": None}), None),  # added optional
    (lambda f: f.__setitem__(2, {"name": "qty", "type": "long"}), None),  # int → long
    (lambda f: f.__setitem__(4, {"name": "price", "type": {"type": "bytes", "logicalType": "decimal",
                                                            "precision": 12, "scale": 2}}), None),
    (lambda f: f.__setitem__(1, {"name": "item", "type": ["null", "string"]}), None),  # required → optional
    (lambda f: f.__setitem__(8, {"name": "state", "type": {"type": "enum", "name": "State",
                                                            "symbols": ["NEW", "PAID", "SENT"]}}), None),
    (lambda f: f.__setitem__(1, {"name": "name", "type": "string"}), "required column item"),  # renamed
    (lambda f: f.__setitem__(0, {"name": "id", "type": "int"}), "column id is long"),  # narrowed
    (lambda f: f.__setitem__(0, {"name": "id", "type": "string"}), "column id is long"),  # another type
    (lambda f: f.__setitem__(4, {"name": "price", "type": {"type": "bytes", "logicalType": "decimal",
                                                            "precision": 9, "scale": 3}}), "column price"),
])
def test_which_version_changes_evolve_the_table(change: Any, why: str | None) -> None:
    reason = change_reason(_fields(ORDER), _fields(_version(change)))
    assert (reason is None) if why is None else (reason is not None and why in reason), reason


def test_evolution_widens_in_place_and_appends_optional_columns() -> None:
    first = _fields(ORDER)
    later = _fields(_version(lambda f: (f.__setitem__(2, {"name": "qty", "type": "long"}),
                                        f.append({"name": "note", "type": "string"}))))
    after = evolve(first, later)
    kinds = _kinds(after)
    assert kinds["qty"] == ("long", True) and kinds["note"] == ("string", False)  # added columns are optional
    assert [f.field_id for f in after[:len(first)]] == [f.field_id for f in first]  # ids stay
    assert fits_reason(after, first) is None  # records of the first version still fit the widened table
    assert fits_reason(first, later) is not None  # and the other way round not
    # an older version met again (a pass replaying the versions) never narrows or drops a column
    assert [(f.name, str(f.field_type), f.required) for f in evolve(after, first)] == \
        [(f.name, str(f.field_type), f.required) for f in after]


def _payload(schema: dict[str, Any], record: dict[str, Any], schema_id: int) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    return b"\0" + struct.pack(">I", schema_id) + out.getvalue()


def _decoder(rejected: dict[int, str] | None = None) -> ValueDecoder:
    plan = DecodePlan(RegistryConfig("http://127.0.0.1:9"), {1: ("AVRO", json.dumps(ORDER))}, rejected or {})
    return ValueDecoder(plan, value_columns(typed_schema(_fields(ORDER))))


def test_values_decode_to_columns_or_are_dead_letters_with_the_reason() -> None:
    good = _payload(ORDER, ROW, 1)
    dec = _decoder({2: "an incompatible change"})
    columns, why = dec.decode(good)
    assert why is None and columns == RAW_ROW
    assert dec.decode(good[:1] + struct.pack(">I", 2) + good[5:]) == (None, "an incompatible change")
    assert "magic byte 103" in str(dec.decode(b"garbage")[1])
    assert "5-byte header" in str(dec.decode(b"\0\0")[1])
    assert dec.decode(None) == (None, "no value (a tombstone)")
    assert "does not match schema id 1" in str(dec.decode(good[:12])[1])
    assert "1 bytes past the end" in str(dec.decode(good + b"!")[1])


def test_a_batch_splits_into_rows_and_dead_letters_in_offset_order() -> None:
    values = [_payload(ORDER, {**ROW, "id": i}, 1) if i % 3 else b"\x01bad bytes" for i in range(9)]
    raw = pa.RecordBatch.from_pylist(
        [{"key": b"k", "value": v, "topic": "t", "partition": 1, "offset": 100 + i,
          "timestamp": datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC), "timestampType": 0, "headers": None,
          "leaderEpoch": 4, "producerId": -1} for i, v in enumerate(values)],
        schema=schema_to_pyarrow(iceberg_schema()))
    typed = schema_to_pyarrow(typed_schema(_fields(ORDER)))
    rows, dead = split_batch(raw, _decoder(), typed, schema_to_pyarrow(dlq_schema()))
    assert rows.column("_kafka_offset").to_pylist() == [101, 102, 104, 105, 107, 108]
    assert rows.column("id").to_pylist() == [1, 2, 4, 5, 7, 8]
    assert rows.column("_kafka_leader_epoch").to_pylist() == [4] * 6
    assert rows.schema.equals(typed) and dead.schema.equals(schema_to_pyarrow(dlq_schema()))
    first = rows.slice(0, 1).to_pylist()[0]  # Arrow's types after the one cast: the values as Avro means them
    assert {k: first[k] for k in ("at", "day", "price", "ref", "ship")} == \
        {k: ROW[k] for k in ("at", "day", "price", "ref", "ship")}
    assert first["counts"] == [("a", 1)] and first["tags"] == ["hot"]
    assert dead.column("offset").to_pylist() == [100, 103, 106]
    assert dead.column("value").to_pylist() == [b"\x01bad bytes"] * 3
    assert all("magic byte 1" in e for e in dead.column("error").to_pylist())


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64), st.sampled_from([0, 1]))
def test_any_bytes_decode_or_are_a_dead_letter(tail: bytes, magic: int) -> None:
    dec = _decoder()
    value = bytes([magic]) + struct.pack(">I", 1) + tail
    columns, why = dec.decode(value)
    assert (columns is None) != (why is None)
    if columns is not None:  # then the bytes are exactly one record of the schema
        assert _payload(plain_avro(ORDER), {**columns, "at": columns["at"] // 1000}, 1) == value


def test_typed_table_rules_and_names() -> None:
    rules = typed_table_rules("orders|pay.*=kafka.{topic}; audit=raw.audit_typed")
    assert [(r.pattern, p) for r, p in rules] == [("orders|pay.*", "kafka.{topic}"), ("audit", "raw.audit_typed")]
    assert typed_table_name("kafka.{topic}", "shop.orders-v2") == "kafka.shop_orders_v2"
    for bad in ("orders", "orders=nodot", "([=kafka.t", "x=kafka.{name}", " ; "):
        with pytest.raises(ValueError):
            typed_table_rules(bad)


def test_string_and_bytes_values_are_one_column_and_non_utf8_strings_dead_letters() -> None:
    for fmt, column in (("string", "string"), ("bytes", "binary")):
        assert [(f.name, str(f.field_type), f.required) for f in plain_fields(fmt)] == [("value", column, False)]
    text = ValueDecoder(DecodePlan(None, value_format="string", record=False), plain_fields("string"))
    assert text.decode("grüße".encode()) == ({"value": "grüße"}, None)
    assert text.decode(b"\xff\xfe") == (None, "value is not UTF-8 (invalid start byte at byte 0)")
    assert text.decode(None) == (None, "no value (a tombstone)")
    raw = ValueDecoder(DecodePlan(None, value_format="bytes", record=False), plain_fields("bytes"))
    assert raw.decode(b"\0\xff") == ({"value": b"\0\xff"}, None)


PAYMENT = {"type": "object", "title": "Payment", "properties": {
    "id": {"type": "integer"}, "amount": {"type": "number"}, "paid": {"type": "boolean"},
    "at": {"type": "string", "format": "date-time"}, "day": {"type": ["string", "null"], "format": "date"},
    "memo": {"type": "string"}, "lines": {"type": "array", "items": {"type": "object", "properties": {
        "sku": {"type": "string"}, "n": {"type": "integer"}}, "required": ["sku"]}},
    "attrs": {"type": "object", "additionalProperties": {"type": "string"}}},
    "required": ["id", "amount", "at", "day"]}


def _json_decoder() -> ValueDecoder:
    plan = DecodePlan(RegistryConfig("http://127.0.0.1:9"), {5: ("JSON", json.dumps(PAYMENT))}, {})
    return ValueDecoder(plan, value_columns(typed_schema(schema_fields("JSON", json.dumps(PAYMENT)))))


def test_json_schema_properties_map_to_iceberg_columns() -> None:
    kinds = _kinds(schema_fields("JSON", json.dumps(PAYMENT)))
    assert kinds == {"id": ("long", True), "amount": ("double", True), "paid": ("boolean", False),
                     "at": ("timestamptz", True), "day": ("date", False), "memo": ("string", False),
                     "lines": ("struct", False),
                     "attrs": ("map<string, string>", False)}
    later = dict(PAYMENT, properties={**PAYMENT["properties"], "channel": {"type": "string"}})  # type: ignore[dict-item]
    assert change_reason(schema_fields("JSON", json.dumps(PAYMENT)), schema_fields("JSON", json.dumps(later))) is None
    narrowed = dict(PAYMENT, properties={**PAYMENT["properties"], "amount": {"type": "integer"}})  # type: ignore[dict-item]
    assert "amount" in str(change_reason(schema_fields("JSON", json.dumps(PAYMENT)),
                                         schema_fields("JSON", json.dumps(narrowed))))
    for bad in ({"type": "object", "properties": {"x": {"$ref": "#/defs/X"}}},
                {"type": "object", "properties": {"x": {"type": ["string", "integer"]}}}):
        with pytest.raises(UnsupportedSchema):
            schema_fields("JSON", json.dumps(bad))


def _json_value(doc: Any, schema_id: int = 5) -> bytes:
    return b"\0" + struct.pack(">I", schema_id) + json.dumps(doc).encode()


def test_json_documents_decode_to_columns_or_are_dead_letters_naming_the_property() -> None:
    dec = _json_decoder()
    doc = {"id": 1, "amount": 2, "paid": True, "at": "2024-05-01T12:00:00+00:00", "day": "2024-05-01",
           "lines": [{"sku": "a", "n": 2}], "attrs": {"k": "v"}, "undeclared": 1}
    columns, why = dec.decode(_json_value(doc))
    assert why is None and columns == {
        "id": 1, "amount": 2.0, "paid": True, "at": 1714564800 * 10**6, "day": 19844, "memo": None,
        "lines": [{"sku": "a", "n": 2}], "attrs": {"k": "v"}}
    for broken, reason in (({**doc, "id": "1"}, "id is \"1\", not an integer"),
                           ({**doc, "id": True}, "not an integer"),
                           ({k: v for k, v in doc.items() if k != "amount"}, "amount is required"),
                           ({**doc, "at": "2024-05-01T12:00:00"}, "not a date-time with an offset"),
                           ({**doc, "lines": [{"n": 1}]}, "sku is required"),
                           ([1, 2], "not an object")):
        columns, why = dec.decode(_json_value(broken))
        assert columns is None and reason in str(why), why
    assert "not JSON" in str(dec.decode(b"\0\0\0\0\x05{not json")[1])


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64))
def test_any_bytes_after_a_json_schema_id_decode_or_are_a_dead_letter(tail: bytes) -> None:
    columns, why = _json_decoder().decode(b"\0" + struct.pack(">I", 5) + tail)
    assert (columns is None) != (why is None)


def test_the_latest_record_per_key_is_the_highest_offset_then_the_latest_timestamp() -> None:
    import pyarrow as pa

    from tierproxy.jobs.iceberg.upsert import KEY, OFFSET, PARTITION, TIMESTAMP, latest

    rows = [  # key, partition, offset, timestamp, file, row
        (b"a", 0, 1, 50, 0, 0), (b"a", 0, 7, 10, 1, 0), (b"a", 0, 3, 90, 0, 1),  # offset 7 wins: Kafka's rule
        (b"b", 0, 2, 10, 0, 2), (b"b", 1, 1, 20, 0, 3),  # in two partitions: the later timestamp
        (b"c", 0, 4, 30, 0, 4), (b"c", 1, 9, 30, 1, 1),  # same timestamp: the higher partition
        (b"", 1, 5, 0, 1, 2),  # an empty key is a key
    ]
    t = pa.table(list(zip(*rows, strict=True)), names=[KEY, PARTITION, OFFSET, TIMESTAMP, "file", "row"])
    t = t.cast(pa.schema([(KEY, pa.large_binary()), (PARTITION, pa.int32()), (OFFSET, pa.int64()),
                          (TIMESTAMP, pa.int64()), ("file", pa.int32()), ("row", pa.int64())]))
    won = latest(t)
    assert sorted(zip(won.column(KEY).to_pylist(), won.column(OFFSET).to_pylist(), strict=True)) == [
        (b"", 5), (b"a", 7), (b"b", 1), (b"c", 9)]


def test_upsert_splits_tombstones_and_keyless_records_from_the_rest() -> None:
    import pyarrow as pa
    from pyiceberg.io.pyarrow import schema_to_pyarrow

    from tierproxy.jobs.iceberg.typed import dlq_schema
    from tierproxy.jobs.iceberg.upsert import NO_KEY, split_for_upsert

    raw = schema_to_pyarrow(iceberg_schema())
    recs = [{"key": k, "value": v, "topic": "t", "partition": 0, "offset": i, "timestamp": i, "timestampType": 0,
             "headers": None, "leaderEpoch": 0, "producerId": -1}
            for i, (k, v) in enumerate([(b"a", b"x"), (b"a", None), (None, b"y"), (None, None), (b"b", b"z")])]
    rest, tombs, dead = split_for_upsert(pa.RecordBatch.from_pylist(recs, schema=raw), schema_to_pyarrow(dlq_schema()))
    assert rest.column("offset").to_pylist() == [0, 4]
    assert tombs.to_pylist() == [{"_kafka_key": b"a", "_kafka_partition": 0, "_kafka_offset": 1,
                                  "_kafka_timestamp": tombs.column("_kafka_timestamp")[0].as_py()}]
    assert dead.column("offset").to_pylist() == [2, 3] and set(dead.column("error").to_pylist()) == {NO_KEY}
