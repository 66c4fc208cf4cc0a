"""A topic whose broker retention deleted the early segments after `tier` copied them, and a proxy serving it."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import Producer

from tests.support.kafka import create_topic, set_retention, watermarks
from tests.support.proxy import ProxyProcess
from tests.support.tiering import settings, tier_once
from tierproxy.dev.kafkadist import KafkaCluster


@dataclass
class TieredTopic:
    topic: str
    partitions: int
    produced: dict[int, list[tuple[bytes | None, bytes | None, int]]]  # partition → (key, value, timestamp)
    tmp: Path
    log_starts: dict[int, int]

    def digest(self, partition: int) -> str:
        h = hashlib.sha256()
        for k, v, _ in self.produced[partition]:
            h.update(repr((k, v)).encode())
        return h.hexdigest()


def make_tiered_topic(kafka: KafkaCluster, tmp: Path, topic: str, partitions: int = 1, n: int = 3000,
                      transactions: bool = False) -> TieredTopic:
    create_topic(kafka.bootstrap, topic, partitions=partitions, config={"segment.ms": "300"})
    produced: dict[int, list[tuple[bytes | None, bytes | None, int]]] = {p: [] for p in range(partitions)}
    p = Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 5, "compression.type": "lz4"})
    ts0 = int(time.time() * 1000) - 600_000
    for i in range(n):
        part = i % partitions
        key, value = (None if i % 9 == 0 else f"k{i}".encode()), f"value-{i}".encode() * 5
        p.produce(topic, value, key, partition=part, timestamp=ts0 + i * 100)
        produced[part].append((key, value, ts0 + i * 100))
        if i % 500 == 499:
            p.flush(10)
            time.sleep(0.35)  # several broker segments
    p.flush(30)
    s = settings(kafka.bootstrap, tmp, topic, tier_segment_bytes=32 * 1024)
    summary = tier_once(s)
    assert summary.failed == 0 and summary.segments > 0
    set_retention(kafka.bootstrap, topic, 1000)
    deadline = time.monotonic() + 60
    starts = {q: 0 for q in range(partitions)}
    while time.monotonic() < deadline and not all(v > 0 for v in starts.values()):
        for q in range(partitions):
            p.produce(topic, b"tail", b"tail", partition=q)
            produced[q].append((b"tail", b"tail", -1))
        p.flush(5)
        time.sleep(0.4)
        starts = {q: watermarks(kafka.bootstrap, topic, q)[0] for q in range(partitions)}
    set_retention(kafka.bootstrap, topic, 3_600_000)
    assert all(v > 0 for v in starts.values()), "the broker never deleted the early segments"
    return TieredTopic(topic, partitions, produced, tmp, starts)


@pytest.fixture
def tiered_proxy(kafka: KafkaCluster, tmp_path: Path, topic_name: str) -> Iterator[tuple[TieredTopic, ProxyProcess]]:
    tt = make_tiered_topic(kafka, tmp_path, topic_name, partitions=2)
    proxy = ProxyProcess(kafka.bootstrap, tmp_path, extra={"TIERPROXY_STORAGE": f"file://{tmp_path}/tier",
                                                           "TIERPROXY_METADATA": f"file://{tmp_path}/meta"})
    yield tt, proxy
    proxy.stop()
