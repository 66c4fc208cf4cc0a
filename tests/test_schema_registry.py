"""The Schema Registry the typed-table tests will read schemas from is real and speaks Confluent's API: Apicurio
Registry, with confluent-kafka's own serializers against it as applications use them (the wire format: magic
byte 0, the 4-byte schema id, the Avro payload)."""

from __future__ import annotations

import struct

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from tests.support.registry import Registry

pytestmark = [pytest.mark.registry]
ORDER_V1 = """{"type": "record", "name": "Order", "namespace": "shop", "fields": [
  {"name": "id", "type": "long"}, {"name": "item", "type": "string"}]}"""
ORDER_V2 = """{"type": "record", "name": "Order", "namespace": "shop", "fields": [
  {"name": "id", "type": "long"}, {"name": "item", "type": "string"},
  {"name": "note", "type": ["null", "string"], "default": null}]}"""


def test_records_serialized_against_the_registry_carry_its_schema_ids(schema_registry: Registry) -> None:
    with SchemaRegistryClient({"url": schema_registry.url, "timeout": 30}) as client:
        _round_trip(client)


def _round_trip(client: SchemaRegistryClient) -> None:
    ctx = SerializationContext("orders-registry-test", MessageField.VALUE)
    first = AvroSerializer(client, ORDER_V1)({"id": 1, "item": "tea"}, ctx)
    second = AvroSerializer(client, ORDER_V2)({"id": 2, "item": "cup", "note": "blue"}, ctx)
    assert first is not None and second is not None
    (magic1, id1), (magic2, id2) = struct.unpack_from(">bI", first), struct.unpack_from(">bI", second)
    assert magic1 == magic2 == 0 and id1 != id2  # a compatible new version: a new id under the same subject
    assert [v for v in client.get_versions("orders-registry-test-value")] == [1, 2]
    read = AvroDeserializer(client)
    assert read(first, ctx) == {"id": 1, "item": "tea"}
    assert read(second, ctx) == {"id": 2, "item": "cup", "note": "blue"}
    assert client.get_schema(id2).schema_str is not None and "note" in client.get_schema(id2).schema_str
