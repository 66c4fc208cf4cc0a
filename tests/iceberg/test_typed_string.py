"""A typed table of plain-text values (`iceberg.value.format=string`, no schema registry): each UTF-8 value one row of
a `value` column, every other value (not UTF-8, a tombstone) a dead letter; rows + dead letters = the records."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest
from confluent_kafka import Producer

from tests.support.iceberg import iceberg_cli, pyiceberg_table
from tests.support.kafka import create_topic
from tests.support.spark import delete_on_broker, tier_once
from tierproxy.dev.kafkadist import KafkaCluster

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


def test_string_values_are_one_column_and_the_rest_are_dead_letters(kafka: KafkaCluster, tmp_path: Path) -> None:
    topic = f"typed-lines-{os.getpid()}"
    create_topic(kafka.bootstrap, topic, partitions=1, config={"segment.ms": "500"})
    sent: list[bytes | None] = [f"line {i}: grüße".encode() if i % 10 else b"\xff\xfe not text" for i in range(200)]
    sent += [None, b"last line"]
    p = Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 5, "enable.idempotence": True})
    for i, v in enumerate(sent):
        p.produce(topic, v, f"k{i}".encode())
    p.flush(30)
    storage, metadata = f"file://{tmp_path}/tier", f"file://{tmp_path}/meta"
    tier_once(kafka.bootstrap, topic, storage, metadata, tmp_path)
    delete_on_broker(kafka.bootstrap, topic, 1)
    env = {"TIERPROXY_ICEBERG_TABLES": f"{topic}=logs.{{topic}}", "TIERPROXY_ICEBERG_VALUE_FORMAT": "string"}
    args = ["--bootstrap-server", kafka.bootstrap, "--storage", storage, "--metadata", metadata, "--master", "local[2]",
            "--once"]
    out = iceberg_cli(tmp_path, *args, env=env)
    assert " 21 dead letters" in out.stdout, out.stdout
    uri, wh = f"sqlite:///{tmp_path}/tier/iceberg/catalog.db", f"file://{tmp_path}/tier/iceberg"
    name = "logs." + topic.replace("-", "_")
    table = pyiceberg_table(uri, wh, name)
    assert (table.schema().fields[0].name, str(table.schema().fields[0].field_type)) == ("value", "string")
    rows = {r["_kafka_offset"]: (r["value"], r["_kafka_key"]) for r in table.scan().to_arrow().to_pylist()}
    assert rows == {o: (v.decode(), f"k{o}".encode()) for o, v in enumerate(sent) if v is not None and o % 10}
    dead = {r["offset"]: r for r in pyiceberg_table(uri, wh, f"{name}_dlq").scan().to_arrow().to_pylist()}
    assert sorted(dead) == [o for o in range(0, 200, 10)] + [200]
    assert dead[10]["value"] == b"\xff\xfe not text" and "not UTF-8" in dead[10]["error"]
    assert dead[200]["error"] == "no value (a tombstone)"
    again = iceberg_cli(tmp_path, *args, env=env)
    assert " 0 rows added" in again.stdout and " 0 dead letters" in again.stdout, again.stdout


def test_two_topics_mapping_to_one_typed_table_are_refused_naming_both(kafka: KafkaCluster, tmp_path: Path) -> None:
    """`a-b` and `a.b` are both legal, side by side, and both become table `a_b`: in one table (upsert mode) one
    topic's keys would delete the other's rows. Refused before anything is written: exit 2 naming both topics."""
    stem = f"collide-{os.getpid()}"
    for topic in (f"{stem}-a-b", f"{stem}-a.b"):
        create_topic(kafka.bootstrap, topic)
    env = {"TIERPROXY_ICEBERG_TABLES": f"{re.escape(stem)}-a.b=logs.{{topic}}",  # the regex's . matches - and .
           "TIERPROXY_ICEBERG_VALUE_FORMAT": "string"}
    out = iceberg_cli(tmp_path, "--once", "--bootstrap-server", kafka.bootstrap, "--storage",
                      f"file://{tmp_path}/tier", "--metadata", f"file://{tmp_path}/meta", env=env, check=False)
    assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
    line = [ln for ln in out.stderr.splitlines() if ln.startswith("tierproxy:")][-1]
    assert f"'{stem}-a-b'" in line and f"'{stem}-a.b'" in line and f"logs.{stem.replace('-', '_')}_a_b" in line
    assert "Traceback" not in out.stderr


def test_upsert_keeps_the_latest_record_per_key_wherever_passes_cut(kafka: KafkaCluster, tmp_path: Path) -> None:
    """Key k written at timestamp 2000 to partition 1 (A) and at 1000 to partition 0 (B): the latest is A (across
    partitions the later timestamp). Four topics: A then B and B then A, each in one pass and cut between two
    passes. Every table holds A for k. Before: a pass compared only its own records, so when B came in a pass after
    A's, it replaced A."""
    from confluent_kafka import Producer

    stem = f"upsert-cut-{os.getpid()}"
    t0 = int(time.time() * 1000) - 600_000
    a, b = (1, t0 + 2000, "A"), (0, t0 + 1000, "B")  # (partition, timestamp, value)
    topics = {f"{stem}-ab-cut": [[a], [b]], f"{stem}-ab-one": [[a, b], []],
              f"{stem}-ba-cut": [[b], [a]], f"{stem}-ba-one": [[b, a], []]}
    for topic in topics:  # a record stamped segment.ms past its segment's first one rolls it (then tiered)
        create_topic(kafka.bootstrap, topic, partitions=2, config={"segment.ms": "1000"})
    storage, metadata = f"file://{tmp_path}/tier", f"file://{tmp_path}/meta"
    env = {"TIERPROXY_ICEBERG_TABLES": f"{re.escape(stem)}-.*=kv.{{topic}}", "TIERPROXY_ICEBERG_VALUE_FORMAT": "string",
           "TIERPROXY_ICEBERG_MODE": "upsert"}
    p = Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 0, "enable.idempotence": True})
    for step in range(2):
        for topic, steps in topics.items():
            for partition, ts, value in steps[step]:
                p.produce(topic, value.encode(), b"k", partition=partition, timestamp=ts)
                p.produce(topic, b"filler", f"filler-{step}-{partition}".encode(), partition=partition,
                          timestamp=t0 + 60_000 * (step + 1))  # closes the segment holding the record
            assert p.flush(30) == 0
            tier_once(kafka.bootstrap, topic, storage, metadata, tmp_path)
        iceberg_cli(tmp_path, "--once", "--bootstrap-server", kafka.bootstrap, "--storage", storage, "--metadata",
                    metadata, "--master", "local[2]", env=env)
    uri, wh = f"sqlite:///{tmp_path}/tier/iceberg/catalog.db", f"file://{tmp_path}/tier/iceberg"
    got = {}
    for topic in topics:
        rows = pyiceberg_table(uri, wh, "kv." + topic.replace("-", "_")).scan().to_arrow().to_pylist()
        got[topic] = [(r["value"], r["_kafka_partition"]) for r in rows if r["_kafka_key"] == b"k"]
    assert got == {topic: [("A", 1)] for topic in topics}, got
