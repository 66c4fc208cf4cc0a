"""Remote-tier scenarios shared by the outage tests and benchmarks: one timed Fetch, a topic tiered to S3 whose broker
has deleted the early segments."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from protocol.constants import ApiKey
from protocol.requests import fetch_request
from tests.support.kafka import broker_forgets, create_topic, small_segment_producer, small_segments
from tests.support.s3 import S3Server
from tests.support.tiering import settings, tier_once
from tierproxy.dev.kafkadist import KafkaCluster
from tierproxy.kafka.wireclient import WireClient


def timed_fetch(address: str, topic: str, offset: int) -> tuple[float, dict[str, Any]]:
    """One Fetch of partition 0 on its own connection: (seconds, the partition's answer)."""
    body = fetch_request({topic: {0: offset}}, max_bytes=1 << 20)
    with WireClient(address) as w:
        start = time.perf_counter()
        resp = w.request(ApiKey.FETCH, 12, body)
    return time.perf_counter() - start, resp["responses"][0]["partitions"][0]


def tier_to_s3_and_forget(kafka: KafkaCluster, s3: S3Server, tmp_path: Path, topic: str, n: int = 3000) -> None:
    """A topic tiered to `s3://tier/p` whose broker has since deleted the early segments, then five records only
    the broker holds."""
    s3.create_bucket("tier")
    # broker segments of 16 KiB (a batch must fit in one); segment.ms lets broker_forgets' ticks roll the last one
    create_topic(kafka.bootstrap, topic, config={**small_segments(16 * 1024), "segment.ms": "300"})
    p = small_segment_producer(kafka.bootstrap)
    for i in range(n):
        p.produce(topic, f"v{i}".encode() * 30)
    assert p.flush(30) == 0
    storage = f"s3://tier/p?endpoint={s3.endpoint}&region={s3.region}"
    assert tier_once(settings(kafka.bootstrap, tmp_path, topic, storage=storage,
                              tier_segment_bytes=16 * 1024)).segments > 1
    broker_forgets(kafka.bootstrap, topic, interval=0.4)
    for i in range(5):  # what only the broker holds (its retention may have taken every record before them)
        p.produce(topic, f"tail-{i}".encode())
    assert p.flush(30) == 0
