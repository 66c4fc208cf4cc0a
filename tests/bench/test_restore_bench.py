"""The restore's fill rate, same run, same broker: `restore.fill` (null-record gzip batches of
`restore.fill.batch.records`, each purged before the next) vs a plain producer writing the same number of null
records (librdkafka, batched, acks=all). Offsets per second for one partition; the restore fills
`FILL_THREADS` partitions at a time.

    pytest -m bench tests/bench/test_restore_bench.py -s      (TIERPROXY_BENCH_FILL offsets, default 2,000,000)
"""

from __future__ import annotations

import os
import time

import pytest
from confluent_kafka import Producer

from tests.bench.report import report
from tests.support.kafka import create_topic, watermarks
from tierproxy.dev.kafkadist import KafkaCluster
from tierproxy.jobs.restore.fill import fill_partition
from tierproxy.jobs.restore.run import FILL_THREADS

pytestmark = [pytest.mark.bench, pytest.mark.kafka]

FILL = int(os.environ.get("TIERPROXY_BENCH_FILL", "2000000"))


def _produce_nulls(bootstrap: str, topic: str, n: int) -> float:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.num.messages": 100_000,
                  "batch.size": 1 << 20, "compression.type": "gzip", "acks": "all",
                  "queue.buffering.max.messages": 1_000_000})
    start = time.perf_counter()
    for _ in range(n):
        while True:
            try:
                p.produce(topic, None, partition=0)
                break
            except BufferError:
                p.poll(0.05)
    p.flush(300)
    return time.perf_counter() - start


@pytest.mark.parametrize("batch", [10_000, 50_000])
def test_fill_rate_vs_a_producer(kafka: KafkaCluster, batch: int) -> None:
    base = f"bench-fill-{batch}-{time.monotonic_ns() % 100000}"
    create_topic(kafka.bootstrap, base + "-producer")
    create_topic(kafka.bootstrap, base + "-fill")
    produced_s = _produce_nulls(kafka.bootstrap, base + "-producer", FILL)
    assert watermarks(kafka.bootstrap, base + "-producer")[1] == FILL
    leader = kafka.bootstrap.split(",")[0]
    result = fill_partition(leader, base + "-fill", 0, FILL, batch, None)
    assert watermarks(kafka.bootstrap, base + "-fill") == (FILL, FILL)
    fill_rate, produce_rate = FILL / result.seconds, FILL / produced_s
    report("restore fill", f"batch {batch}: {fill_rate:,.0f} offsets/s per partition ({FILL_THREADS} partitions "
           f"at a time in a restore) vs a producer of null records {produce_rate:,.0f} offsets/s: "
           f"{fill_rate / produce_rate:.2f}x ({FILL} offsets)")
