"""A topic whose broker retention deleted the early segments after `tier` copied them, and a proxy serving it."""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.kafka import create_topic, set_retention, small_segment_producer, small_segments, watermarks
from tests.support.proxy import ProxyProcess
from tests.support.tiering import settings, tier_once
from tests.support.waiting import proxy_serves_tier, wait_until
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
    """`n` records (timestamps ten minutes old) in broker segments of 16 KiB, tiered, then deleted by the broker's
    retention, then five more per partition: the tier holds the start of each partition, the broker the rest."""
    create_topic(kafka.bootstrap, topic, partitions=partitions, config=small_segments(16 * 1024))
    produced: dict[int, list[tuple[bytes | None, bytes | None, int]]] = {p: [] for p in range(partitions)}
    p = small_segment_producer(kafka.bootstrap, **{"compression.type": "lz4"})
    ts0 = int(time.time() * 1000) - 600_000
    for i in range(n):
        part = i % partitions
        key, value = (None if i % 9 == 0 else f"k{i}".encode()), f"value-{i}".encode() * 5
        p.produce(topic, value, key, partition=part, timestamp=ts0 + i * 100)
        produced[part].append((key, value, ts0 + i * 100))
    p.flush(30)
    assert [watermarks(kafka.bootstrap, topic, q)[1] for q in range(partitions)] == [
        len(produced[q]) for q in range(partitions)], "the broker refused records"
    s = settings(kafka.bootstrap, tmp, topic, tier_segment_bytes=32 * 1024)
    summary = tier_once(s)
    assert summary.failed == 0 and summary.segments > 0

    def log_starts() -> dict[int, int] | None:
        got = {q: watermarks(kafka.bootstrap, topic, q)[0] for q in range(partitions)}
        return got if all(got.values()) else None

    set_retention(kafka.bootstrap, topic, 1000)  # every record is older: all of it goes at the next check
    try:
        starts = wait_until(log_starts, "the broker deletes the early segments", timeout=60, interval=0.2)
    finally:
        set_retention(kafka.bootstrap, topic, 3_600_000)
    for q in range(partitions):  # what only the broker holds
        for i in range(5):
            p.produce(topic, f"tail-{i}".encode(), b"tail", partition=q)
            produced[q].append((b"tail", f"tail-{i}".encode(), -1))
    p.flush(30)
    return TieredTopic(topic, partitions, produced, tmp, starts)


@pytest.fixture(scope="module")
def tiered_proxy(kafka: KafkaCluster, tmp_path_factory: pytest.TempPathFactory,
                 request: pytest.FixtureRequest) -> Iterator[tuple[TieredTopic, ProxyProcess]]:
    """A 2-partition tiered topic and a proxy serving it, shared by a module's tests that only read them."""
    tmp = tmp_path_factory.mktemp("tiered")
    tt = make_tiered_topic(kafka, tmp, f"tiered-{request.module.__name__.rpartition('.')[2]}-{os.getpid()}",
                           partitions=2)
    proxy = ProxyProcess(kafka.bootstrap, tmp, extra={"TIERPROXY_STORAGE": f"file://{tmp}/tier",
                                                      "TIERPROXY_METADATA": f"file://{tmp}/meta"})
    # its port opens before the tier's metadata is loaded (answers meanwhile: REPLICA_NOT_AVAILABLE): the module's
    # tests ask single ListOffsets, in any order and on any xdist worker, so the fixture waits for the tier
    try:
        wait_until(lambda: proxy_serves_tier(proxy.bootstrap, tt.topic, tt.partitions), "the tier via the proxy", 60)
        yield tt, proxy
    finally:
        proxy.stop()
