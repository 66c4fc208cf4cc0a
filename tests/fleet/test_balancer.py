"""Two replicas behind HAProxy behave as one proxy: a consumer group reads the tiered history while one replica is
killed, and a producer and a consumer run through a rolling restart of both."""

from __future__ import annotations

import itertools
import os
import threading
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Message, Producer

from tests.fleet.conftest import metadata_topic
from tests.support.balancer import Fleet
from tests.support.kafka import create_topic, delete_records
from tests.support.tiering import settings, tier_once, tiered
from tests.support.waiting import wait_until
from tierproxy.dev.kafkadist import KafkaCluster

pytestmark = [pytest.mark.kafka, pytest.mark.spark]
RECORDS = 100_000


def _produce_numbered(bootstrap: str, topic: str, n: int) -> dict[tuple[int, int], bytes]:
    """(partition, offset) → value of every record written."""
    written: dict[tuple[int, int], bytes] = {}

    def delivered(err: KafkaError | None, m: Message) -> None:
        assert err is None, err
        written[(m.partition(), m.offset())] = m.value()

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 65536})
    for i in range(n):
        p.produce(topic, f"{i:08d}-".encode() + os.urandom(40).hex().encode(), f"k{i}".encode(), on_delivery=delivered)
        if i % 10_000 == 9_999:
            p.flush(60)
    p.flush(60)
    assert len(written) == n
    return written


def test_a_group_reads_the_tier_through_the_balancer_while_a_replica_is_killed(
        fleet_kafka: KafkaCluster, tmp_path: Path, topic_name: str) -> None:
    kafka = fleet_kafka
    create_topic(kafka.bootstrap, topic_name, partitions=2)
    written = _produce_numbered(kafka.bootstrap, topic_name, RECORDS)
    s = settings(kafka.bootstrap, tmp_path, topic_name, metadata=metadata_topic(), tier_segment_bytes=1 << 20)
    assert tier_once(s).failed == 0
    for p in (0, 1):  # the broker forgets everything tiered: the history is the tier's alone
        end = tiered(s, topic_name, p)[0][-1].end_offset + 1
        assert delete_records(kafka.bootstrap, topic_name, {p: end}) == {p: (0, end)}
    fleet = Fleet(kafka.bootstrap, tmp_path, s.storage, str(s.metadata))
    try:
        fleet.wait_ready()
        c = Consumer({"bootstrap.servers": fleet.address, "group.id": f"fleet-{topic_name}",
                      "auto.offset.reset": "earliest", "enable.auto.commit": True, "auto.commit.interval.ms": 200})
        c.subscribe([topic_name])
        seen: dict[tuple[int, int], int] = {}
        wrong = []
        killed_at = None
        deadline = time.monotonic() + 240
        try:
            while len(seen) < len(written) and time.monotonic() < deadline:
                for m in c.consume(1000, 1.0):
                    if m.error() is not None:
                        assert m.error().retriable() or m.error().code() == KafkaError._PARTITION_EOF, m.error()
                        continue
                    key = (m.partition(), m.offset())
                    seen[key] = seen.get(key, 0) + 1
                    if written.get(key) != m.value():
                        wrong.append(key)
                if killed_at is None and len(seen) >= 0.3 * len(written):
                    fleet.replicas[0].kill()
                    killed_at = len(seen)
        finally:
            c.close()
        duplicates = sum(n - 1 for n in seen.values())
        print(f"replica killed after {killed_at} records; {len(seen)} of {len(written)} read; "
              f"{duplicates} duplicates")
        assert killed_at is not None and killed_at < len(written)
        assert set(seen) == set(written) and wrong == []
    finally:
        fleet.close()


def test_a_rolling_restart_under_a_producer_and_a_consumer(fleet_kafka: KafkaCluster, tmp_path: Path,
                                                           topic_name: str) -> None:
    kafka = fleet_kafka
    create_topic(kafka.bootstrap, topic_name, partitions=2)
    fleet = Fleet(kafka.bootstrap, tmp_path, f"file://{tmp_path}/tier", metadata_topic())
    stop = threading.Event()
    delivered: set[bytes] = set()
    errors: list[str] = []
    consumed: set[bytes] = set()
    times: list[float] = []

    def produce() -> None:
        def done(err: KafkaError | None, m: Message) -> None:
            if err is not None:
                errors.append(str(err))
            else:
                delivered.add(m.value())

        def on_error(err: KafkaError) -> None:  # connection-level: retried by the client unless fatal
            if err.fatal():
                errors.append(f"fatal: {err}")

        p = Producer({"bootstrap.servers": fleet.address, "acks": "all", "enable.idempotence": True,
                      "linger.ms": 5, "error_cb": on_error})
        i = 0
        while not stop.is_set():
            p.produce(topic_name, f"r{i}".encode(), on_delivery=done)
            p.poll(0)
            i += 1
            time.sleep(0.002)
        p.flush(120)

    def consume() -> None:
        c = Consumer({"bootstrap.servers": fleet.address, "group.id": f"roll-{topic_name}",
                      "auto.offset.reset": "earliest"})
        c.subscribe([topic_name])
        try:
            while not (stop.is_set() and delivered and delivered <= consumed):
                for m in c.consume(500, 0.5):
                    if m.error() is None:
                        consumed.add(m.value())
                        times.append(time.monotonic())
        finally:
            c.close()

    try:
        fleet.wait_ready()
        workers = [threading.Thread(target=produce), threading.Thread(target=consume)]
        for w in workers:
            w.start()
        wait_until(lambda: len(consumed) >= 500, "records flowing through the fleet", timeout=60)
        for r in fleet.replicas:
            assert r.stop() == 0  # SIGTERM: drains, exits 0
            r.start()
            started = time.monotonic()
            while not r.ready():
                assert time.monotonic() - started < 60, r.log.read_text(errors="replace")[-2000:]
                time.sleep(0.2)
            seen = len(times)
            wait_until(lambda s=seen: len(times) >= s + 500, "records flowing after the restart", timeout=60)  # type: ignore[misc]
        stop.set()
        for w in workers:
            w.join(180)
        assert not any(w.is_alive() for w in workers)
    finally:
        stop.set()
        fleet.close()
    gap = max((b - a for a, b in itertools.pairwise(times)), default=0.0)
    print(f"{len(delivered)} produced, {len(consumed)} consumed, longest consume gap {gap:.2f}s")
    assert errors == []
    assert len(delivered) > 1000 and delivered <= consumed
