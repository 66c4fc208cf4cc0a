"""Protobuf values on their own: a message's fields as Iceberg columns, which version changes evolve a table, and a
value's bytes (Confluent's wire format with its message index) → its columns or the reason it is a dead letter."""

from __future__ import annotations

import decimal
import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.protobuf import REPEATED, F, bundle, message_classes, order_file
from tierproxy.jobs.iceberg.avro_types import UnsupportedSchema
from tierproxy.jobs.iceberg.evolution import change_reason, fits_reason
from tierproxy.jobs.iceberg.proto_types import message_index
from tierproxy.jobs.iceberg.registry import RegistryConfig
from tierproxy.jobs.iceberg.typed import DecodePlan, ValueDecoder, is_record, schema_fields

V1 = order_file()
TEXT = bundle(V1)
ORDER = message_classes(V1)["Order"]
ADDRESS = message_classes(V1)["Address"]


def _kinds(fields: list[Any]) -> dict[str, tuple[str, bool]]:
    return {f.name: (str(f.field_type), f.required) for f in fields}


def _value(msg: Any, index: bytes = b"\x02\x02", schema_id: int = 3) -> bytes:
    """As confluent-kafka's ProtobufSerializer frames it: Order is the file's second message, index [1]."""
    return b"\0" + struct.pack(">I", schema_id) + index + msg.SerializeToString()


def _decoder() -> ValueDecoder:
    plan = DecodePlan(RegistryConfig("http://127.0.0.1:9"), {3: ("PROTOBUF", TEXT)}, {}, True)
    return ValueDecoder(plan, schema_fields("PROTOBUF", TEXT))


def test_a_messages_fields_map_to_optional_iceberg_columns() -> None:
    assert is_record("PROTOBUF", TEXT)
    assert _kinds(schema_fields("PROTOBUF", TEXT)) == {
        "id": ("long", False), "item": ("string", False), "qty": ("int", False), "at": ("timestamptz", False),
        "tags": ("list<string>", False), "counts": ("map<string, long>", False), "state": ("string", False),
        "ship": ("struct<12: city: optional string, 13: zip: optional string>", False),  # placeholder ids
        "big": ("decimal(20, 0)", False), "memo": ("string", False), "raw": ("binary", False)}


def test_which_version_changes_evolve_the_table() -> None:
    v1 = schema_fields("PROTOBUF", TEXT)
    widened_and_added = schema_fields("PROTOBUF", bundle(order_file(qty=F.TYPE_INT64, channel=True)))
    assert change_reason(v1, widened_and_added) is None
    assert fits_reason(widened_and_added, v1) is None  # older records still fit the evolved table
    retyped = schema_fields("PROTOBUF", bundle(order_file(item=F.TYPE_INT64)))
    assert "item" in str(change_reason(v1, retyped))


def test_values_decode_to_columns_as_a_protobuf_reader_sees_them() -> None:
    msg = ORDER(id=7, item="tea", qty=3, tags=["hot", "new"], state=1, big=2**64 - 1, raw=b"\x00\xff")
    msg.at.seconds, msg.at.nanos = 1714564800, 123_456_789
    msg.counts["a"] = 1
    msg.ship.city = "Oslo"
    msg.memo.value = "gift"
    columns, why = _decoder().decode(_value(msg))
    assert why is None and columns == {
        "id": 7, "item": "tea", "qty": 3, "at": 1714564800_123456, "tags": ["hot", "new"], "counts": {"a": 1},
        "state": "PAID", "ship": {"city": "Oslo", "zip": None}, "big": decimal.Decimal(2**64 - 1), "memo": "gift",
        "raw": b"\x00\xff"}
    empty, why = _decoder().decode(_value(ORDER()))  # proto3 scalars are their defaults; unset messages are null
    assert why is None and empty == {"id": 0, "item": "", "qty": 0, "at": None, "tags": [], "counts": {},
                                     "state": "NEW", "ship": None, "big": decimal.Decimal(0), "memo": None,
                                     "raw": b""}
    assert _decoder().decode(_value(ORDER(state=9)))[0]["state"] == "9"  # type: ignore[index]


def test_other_messages_and_broken_payloads_are_dead_letters_with_the_reason() -> None:
    dec = _decoder()
    assert "names shop.Address, not the table's message shop.Order" in str(
        dec.decode(_value(ADDRESS(city="x"), index=b"\x00"))[1])
    assert "names no message" in str(dec.decode(_value(ORDER(), index=b"\x02\x08"))[1])
    assert "does not match schema id 3" in str(dec.decode(_value(ORDER(id=1))[:-1] + b"\xff")[1])
    assert "cut short" in str(dec.decode(b"\0\0\0\0\x03")[1])


def test_the_message_index_is_confluents_zigzag_path() -> None:
    assert message_index(b"\x00rest", 0) == ([0], 1)
    assert message_index(b"\x02\x02", 0) == ([1], 2)
    assert message_index(b"\x04\x02\x06", 0) == ([1, 3], 3)
    with pytest.raises(ValueError, match="not a valid path"):
        message_index(b"\x01", 0)


def test_schemas_without_an_iceberg_type_are_refused_with_the_reason() -> None:
    recursive = order_file()
    recursive.message_type[0].field.add(name="next", number=9, type=F.TYPE_MESSAGE, type_name=".shop.Address",
                                        label=REPEATED)
    with pytest.raises(UnsupportedSchema, match="recursive"):
        schema_fields("PROTOBUF", bundle(recursive))
    with pytest.raises(UnsupportedSchema, match="not a serialized Protobuf schema"):
        schema_fields("PROTOBUF", 'syntax = "proto3"; message A {}')
    missing = order_file()
    missing.message_type[1].field.add(name="x", number=20, type=F.TYPE_MESSAGE, type_name=".other.Thing")
    with pytest.raises(UnsupportedSchema, match=r"order\.proto"):
        schema_fields("PROTOBUF", bundle(missing))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64))
def test_any_bytes_after_a_protobuf_schema_id_decode_or_are_a_dead_letter(tail: bytes) -> None:
    columns, why = _decoder().decode(b"\0" + struct.pack(">I", 3) + tail)
    assert (columns is None) != (why is None)
