"""A real Kafka Streams application (Kafka's own `kafka-streams` jar, `tests/streams/TableApp.java`) builds a KTable
from an input topic of updates and tombstones; its changelog, a compacted topic whose broker keeps the last minutes
only (`cleanup.policy=compact,delete`, set through Streams' topic configs), is tiered. The instance loses its disk
(state directory wiped) and starts again with the proxy as its bootstrap: Streams restores the store from the
changelog's earliest offset, which only the tier still holds, and the store equals the table the whole input makes,
key by key (the steps: tests/support/streams_restore.py). The full size, 1,000,000 updates over 100,000 keys, is a
benchmark: tests/bench/test_streams_bench.py."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.support.streams_restore import Size, restore_through_the_proxy
from tierproxy.dev.kafkadist import KafkaCluster

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.process]  # the steps start `tierproxy serve`

# 20,000 updates over 2,000 keys, 5 % tombstones, two partitions; 32 KiB broker segments, 64 KiB tier segments
SUITE = Size(updates=20_000, keys=2_000, partitions=2, segment_bytes=32 * 1024, tier_segment_bytes=64 * 1024)


def test_a_wiped_kafka_streams_ktable_is_restored_through_the_proxy_from_the_tier(
        kafka: KafkaCluster, tmp_path: Path) -> None:
    """~30 s: two Streams JVM runs (build, restore), a tier pass, a proxy."""
    out = restore_through_the_proxy(kafka.bootstrap, tmp_path, f"table-{os.getpid()}-{time.monotonic_ns() % 10**6}",
                                    SUITE)
    print("figures:", {k: round(v, 1) for k, v in out.figures.items()})  # shown with a failure, or with -s
    assert out.figures["keys"] > SUITE.keys * 9 // 10  # the table is not trivially small
