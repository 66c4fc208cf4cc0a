"""The first fetch of a cold catch-up: how long a fresh proxy takes to answer a new connection's first Fetch of
offset 0 from the filesystem tier, against the broker answering the same Fetch of its own log's first offset.

Measured on the wire (no client's start, metadata or group join on either side): a new connection, then one
Fetch (by name, v12, as librdkafka before topic ids — alone, and after the Metadata request a client sends first,
which names the topic's current id; by id, v15), timed from its send to its whole answer. Each
round starts a fresh proxy and waits until it is as ready as it makes itself before any client asks (the tier's
metadata loaded, then the tiered topics' ids and leaders and a connection of its own to each leader: `_warm` in
tierproxy/remote/service.py), nothing asked of it by a client yet, so the first fetch pays whatever a cold catch-up
pays from a proxy that is up.

    pytest -m bench tests/bench/test_first_fetch_bench.py -s   (TIERPROXY_BENCH_FIRST_FETCH_ROUNDS, default 7)
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

import pytest

from protocol.constants import ApiKey
from protocol.records import iter_batches
from protocol.requests import fetch_request
from tests.bench.clients import produce
from tests.bench.report import report
from tests.bench.test_catch_up_bench import _forget
from tests.support.kafka import create_topic, watermarks
from tests.support.proxy import ProxyProcess
from tests.support.tiering import settings, tier_once
from tierproxy.dev.kafkadist import KafkaCluster
from tierproxy.kafka.wireclient import WireClient

pytestmark = [pytest.mark.bench, pytest.mark.kafka, pytest.mark.spark]
ROUNDS = int(os.environ.get("TIERPROXY_BENCH_FIRST_FETCH_ROUNDS", "7"))
MAX_BYTES = 4 << 20


def _first_fetch(address: str, topic: str, offset: int, version: int, topic_id: bytes, metadata: bool) -> float:
    """ms from a new connection's first Fetch of `offset` to its answer (which must hold that offset); with
    `metadata`, the connection asks Metadata for the topic first (not timed), as a client does before fetching."""
    with WireClient(address, timeout=30) as w:
        if metadata:
            w.request(ApiKey.METADATA, 12, {"topics": [{"name": topic, "topic_id": bytes(16)}],
                                            "allow_auto_topic_creation": False,
                                            "include_topic_authorized_operations": False})
        body = fetch_request({topic: {0: offset}}, max_bytes=MAX_BYTES, topic_ids={topic: topic_id})
        start = time.perf_counter()
        resp = w.request(ApiKey.FETCH, version, body)
        took = (time.perf_counter() - start) * 1000
    part = resp["responses"][0]["partitions"][0]
    batches = list(iter_batches(part["records"]))
    assert part["error_code"] == 0 and batches and batches[0].base_offset <= offset <= batches[-1].last_offset, part
    return took


def _topic_id(address: str, topic: str) -> bytes:
    with WireClient(address) as w:
        meta = w.request(ApiKey.METADATA, 12, {"topics": [{"name": topic, "topic_id": bytes(16)}],
                                               "allow_auto_topic_creation": False,
                                               "include_topic_authorized_operations": False})
    return bytes(meta["topics"][0]["topic_id"])


@pytest.mark.timeout(1200)
def test_first_fetch_of_a_cold_catch_up_vs_the_brokers(kafka: KafkaCluster, tmp_path: Path) -> None:
    segment = {"segment.bytes": str(4 << 20)}
    for kind in ("local", "tiered"):
        create_topic(kafka.bootstrap, f"ff-{kind}", config=segment)
        produce(kafka, f"ff-{kind}", (32 << 20) // 1024, 1024)
    assert tier_once(settings(kafka.bootstrap, tmp_path, "ff-", tier_topics="ff-tiered",
                              tier_segment_bytes=4 << 20)).failed == 0
    assert _forget(kafka, "ff-tiered", 1)[0] > 0
    local_start = watermarks(kafka.bootstrap, "ff-local", 0)[0]
    ids = {t: _topic_id(kafka.bootstrap, t) for t in ("ff-local", "ff-tiered")}
    figures = []
    for version, metadata in ((12, False), (12, True), (15, False)):
        direct, proxied = [], []
        for _ in range(ROUNDS):
            proxy = ProxyProcess(kafka.bootstrap, tmp_path, extra={
                "TIERPROXY_STORAGE": f"file://{tmp_path}/tier", "TIERPROXY_METADATA": f"file://{tmp_path}/meta"})
            try:
                proxy.wait_tier_ready()  # nothing asked of the proxy yet
                direct.append(_first_fetch(kafka.bootstrap, "ff-local", local_start, version, ids["ff-local"],
                                           metadata))
                proxied.append(_first_fetch(f"127.0.0.1:{proxy.base + 1}", "ff-tiered", 0, version,
                                            ids["ff-tiered"], metadata))
            finally:
                proxy.stop()
        added = [p - d for p, d in zip(proxied, direct, strict=True)]
        label = f"Fetch v{version}" + (" after Metadata" if metadata else "")
        figures.append(f"{label}: proxy {statistics.median(proxied):.1f} ms (min {min(proxied):.1f}), "
                       f"broker {statistics.median(direct):.1f} ms, added {statistics.median(added):.1f} ms "
                       f"(min {min(added):.1f}, max {max(added):.1f})")
        print(figures[-1], flush=True)
    report("first fetch of a cold catch-up (fresh proxy, filesystem tier, new connection; medians of "
           f"{ROUNDS})", "; ".join(figures))
