"""Typed tables of Protobuf values end to end: records produced by confluent-kafka's ProtobufSerializer against a real
registry (Apicurio) through a compatible version change (a widened field and an added one) and an incompatible one,
with records of another message of the schema and bytes that are no message; tiered, deleted by the broker, then
`tierproxy iceberg` builds the typed table from the tier alone. The rows equal the messages the producer wrote."""

from __future__ import annotations

import datetime
import decimal
import os
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from tests.iceberg.test_typed import Typed, _duckdb
from tests.support.iceberg import iceberg_cli, pyiceberg_table
from tests.support.kafka import create_topic
from tests.support.protobuf import F, message_classes, order_file
from tests.support.registry import Registry
from tests.support.spark import delete_on_broker, tier_once
from tests.support.spark_iceberg import spark_iceberg_rows
from tierproxy.dev.kafkadist import KafkaCluster

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.registry]

VERSIONS = {"v1": order_file(), "v2": order_file(qty=F.TYPE_INT64, channel=True),  # widened int32 → int64, added
            "v3": order_file(qty=F.TYPE_INT64, channel=True, item=F.TYPE_INT64)}  # item string → int64: incompatible
EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


def _order(cls: Any, version: str, i: int) -> Any:
    msg = cls(id=i, qty=i * 1000, tags=[f"t{i}"] * (i % 3), state=i % 2, big=2**63 + i)
    msg.item = i if version == "v3" else f"{version}-item-{i}"
    msg.at.seconds, msg.at.nanos = 1_700_000_000 + i, 1000 * i
    if i % 2:
        msg.counts["n"] = i
        msg.ship.city = f"city-{i}"
    if i % 4 == 0:
        msg.memo.value = f"memo {i}"
    if version != "v1" and i % 3 == 0:
        msg.channel = "web"
    return msg


def _columns(msg: Any) -> dict[str, Any]:
    """A message as the typed table must hold it (pyiceberg's Python values)."""
    return {"id": msg.id, "item": msg.item, "qty": msg.qty, "tags": list(msg.tags), "state": ["NEW", "PAID"][msg.state],
            "at": EPOCH + datetime.timedelta(seconds=msg.at.seconds, microseconds=msg.at.nanos // 1000),
            "counts": sorted(msg.counts.items()), "ship": {"city": msg.ship.city, "zip": None} if msg.HasField("ship")
            else None, "big": decimal.Decimal(msg.big), "memo": msg.memo.value if msg.HasField("memo") else None,
            "raw": b"", "channel": getattr(msg, "channel", None)}


def test_protobuf_values_become_columns_through_a_version_change_and_the_rest_are_dead_letters(
        kafka: KafkaCluster, schema_registry: Registry, tmp_path: Path) -> None:
    t = Typed(kafka, schema_registry, tmp_path, f"typed-proto-{os.getpid()}")
    create_topic(kafka.bootstrap, t.topic, partitions=1, config={"segment.ms": "500"})
    ctx = SerializationContext(t.topic, MessageField.VALUE)
    sent: list[tuple[str, Any]] = []  # in offset order: (what it is, the message)
    with SchemaRegistryClient({"url": schema_registry.url, "timeout": 30}) as client:
        p = Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 5, "enable.idempotence": True})
        for version, fd in VERSIONS.items():
            classes = message_classes(fd)
            ser = ProtobufSerializer(classes["Order"], client, {"use.deprecated.format": False})
            for i in range(50):
                msg = _order(classes["Order"], version, i)
                p.produce(t.topic, ser(msg, ctx))
                sent.append((version, msg))
            if version == "v1":  # another message of the same schema (message index [0]), and no message at all
                address = ProtobufSerializer(classes["Address"], client, {"use.deprecated.format": False})
                for i in range(5):
                    p.produce(t.topic, address(classes["Address"](city=f"c{i}"), ctx))
                    sent.append(("address", None))
                header = ser(_order(classes["Order"], version, 0), ctx)[:7]
                for _ in range(5):
                    p.produce(t.topic, header + b"\xff\xff\xff")
                    sent.append(("garbage", None))
        p.flush(30)
    tier_once(kafka.bootstrap, t.topic, t.storage, t.metadata, tmp_path)
    delete_on_broker(kafka.bootstrap, t.topic, 1)
    out = iceberg_cli(tmp_path, *t.args("--once"), env=t.env())
    assert " 60 dead letters" in out.stdout, out.stdout  # v3's 50, 5 addresses, 5 broken
    uri, wh = f"sqlite:///{tmp_path}/tier/iceberg/catalog.db", f"file://{tmp_path}/tier/iceberg"
    table = pyiceberg_table(uri, wh, t.table)
    kinds = {f.name: str(f.field_type) for f in table.schema().fields}
    assert (kinds["qty"], kinds["item"], kinds["channel"], kinds["big"]) == ("long", "string", "string",
                                                                             "decimal(20, 0)")
    rows = {r["_kafka_offset"]: r for r in table.scan().to_arrow().to_pylist()}
    want = {o: _columns(m) for o, (kind, m) in enumerate(sent) if kind in ("v1", "v2")}
    assert set(rows) == set(want)
    for offset, columns in want.items():
        got = {c: rows[offset][c] for c in columns}
        assert got == columns, offset
    dead = {r["offset"]: r["error"] for r in pyiceberg_table(uri, wh, f"{t.table}_dlq").scan().to_arrow().to_pylist()}
    assert len(rows) + len(dead) == len(sent) and not set(rows) & set(dead)
    kinds_of = {o: kind for o, (kind, _) in enumerate(sent)}
    assert all("item" in dead[o] for o in dead if kinds_of[o] == "v3"), dead
    assert all("names shop.Address" in dead[o] for o in dead if kinds_of[o] == "address")
    assert all("does not match" in dead[o] for o in dead if kinds_of[o] == "garbage")
    meta = iceberg_cli(tmp_path, *t.args("metadata-location", "--table", t.table), env=t.env()).stdout.strip()
    seen = _duckdb(meta, ['"_kafka_offset"', '"id"', '"qty"', 'CAST("big" AS VARCHAR) AS big'])
    assert sorted((r["_kafka_offset"], r["id"], r["qty"], r["big"]) for r in seen) == \
        sorted((o, c["id"], c["qty"], str(c["big"])) for o, c in want.items())
    spark = spark_iceberg_rows(meta, ["_kafka_offset", "id", "qty", "CAST(big AS STRING) AS big"])
    assert sorted((r["_kafka_offset"], r["id"], r["qty"], r["big"]) for r in spark) == \
        sorted((o, c["id"], c["qty"], str(c["big"])) for o, c in want.items())
    again = iceberg_cli(tmp_path, *t.args("--once"), env=t.env())
    assert " 0 rows added" in again.stdout and " 0 dead letters" in again.stdout, again.stdout
