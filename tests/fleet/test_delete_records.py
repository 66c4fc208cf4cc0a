"""DeleteRecords into the tier, as Kafka with tiered storage answers it (its own tiered-storage tests
`DeleteSegmentsDueToLogStartOffsetBreachTest` and `ListOffsetsTest`): the broker keeps offsets from L, the tier holds
0..L-1, a client purges at L/2 through one replica. The new log start is recorded in the metadata before the answer,
so it holds on a second replica that never saw the request, in the Spark reader, after the next tier pass and after
restarting the broker and the proxies. A broker log start moved by anything but a purge through a proxy is never
taken for a purge."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient

from protocol.constants import ApiKey, ErrorCode, OffsetSpec
from protocol.requests import fetch_request, list_offsets_request, listed_offsets
from tests.fleet.conftest import metadata_topic, replica
from tests.support.kafka import create_topic, delete_records, fill_topic, offsets_from_the_beginning, watermarks
from tests.support.proxy import ProxyProcess
from tests.support.spark import local_session
from tests.support.tiering import settings, tier_once, tiered
from tests.support.waiting import proxy_serves_tier, wait_until
from tierproxy.dev.kafkadist import KafkaCluster
from tierproxy.kafka.wireclient import WireClient
from tierproxy.tier.open import open_metadata

pytestmark = [pytest.mark.kafka, pytest.mark.spark]




def listed(bootstrap: str, topic: str, spec: int) -> int:
    with WireClient(bootstrap, timeout=30) as w:
        resp = w.request(ApiKey.LIST_OFFSETS, 9, list_offsets_request({topic: {0: spec}}))
    return listed_offsets(resp)[(topic, 0)]


def fetch_error(bootstrap: str, topic: str, offset: int) -> int:
    with WireClient(bootstrap, timeout=30) as w:
        resp = w.request(ApiKey.FETCH, 12, fetch_request({topic: {0: offset}}, max_bytes=1 << 20))
    return int(resp["responses"][0]["partitions"][0]["error_code"])




def _spark_offsets(bootstrap: str, topic: str, storage: str, metadata: str) -> list[int]:
    df = local_session().read.format("tierproxy").option("kafka.bootstrap.servers", bootstrap) \
        .option("subscribe", topic).option("storage", storage).option("metadata", metadata) \
        .option("includeLive", "true").load()
    return sorted(r[0] for r in df.select("offset").collect())


def _tiered_topic(kafka: KafkaCluster, tmp_path: Path, topic: str) -> tuple[Any, int]:
    """A topic whose first L offsets only the tier holds: tiered, then the broker's log start moved to L by a
    DeleteRecords sent to the broker itself (as a purge bypassing the proxies, or retention, would)."""
    create_topic(kafka.bootstrap, topic)
    fill_topic(kafka.bootstrap, topic, 3000)
    s = settings(kafka.bootstrap, tmp_path, topic, metadata=metadata_topic(), tier_segment_bytes=64 * 1024)
    assert tier_once(s).segments >= 4
    tier_end = tiered(s, topic)[0][-1].end_offset
    assert delete_records(kafka.bootstrap, topic, {0: tier_end + 1}) == {0: (0, tier_end + 1)}
    fill_topic(kafka.bootstrap, topic, 100)  # the broker's part
    return s, tier_end + 1


def test_delete_records_into_the_tier_is_one_durable_fact(fleet_kafka: KafkaCluster, tmp_path: Path,
                                                          topic_name: str) -> None:
    kafka = fleet_kafka
    s, local_start = _tiered_topic(kafka, tmp_path, topic_name)
    half = local_start // 2
    hw = watermarks(kafka.bootstrap, topic_name)[1]
    one = replica(kafka.bootstrap, tmp_path, s.storage, s.metadata)
    two = replica(kafka.bootstrap, tmp_path, s.storage, s.metadata)
    proxies: list[ProxyProcess] = [one, two]
    try:
        for p in proxies:
            wait_until(lambda p=p: proxy_serves_tier(p.bootstrap, topic_name), "the replica's tier", timeout=60)
        # the broker's moved log start was no purge: the tier still serves everything, and a pass keeps it
        assert listed(one.bootstrap, topic_name, OffsetSpec.EARLIEST) == 0
        assert tier_once(s).purged == 0 and tiered(s, topic_name)[0][0].start_offset == 0

        # bad input: the broker's errors, nothing purged
        direct = delete_records(kafka.bootstrap, topic_name, {0: hw + 10})
        assert delete_records(one.bootstrap, topic_name, {0: hw + 10}) == direct
        assert direct[0][0] == ErrorCode.OFFSET_OUT_OF_RANGE
        for bad in ({0: -5}, {7: 3}):
            assert delete_records(one.bootstrap, topic_name, bad) == delete_records(kafka.bootstrap, topic_name, bad)
            assert next(iter(delete_records(one.bootstrap, topic_name, bad).values()))[0] != ErrorCode.NONE
        assert listed(one.bootstrap, topic_name, OffsetSpec.EARLIEST) == 0

        # the purge into the tier, through one replica
        assert delete_records(one.bootstrap, topic_name, {0: half}) == {0: (0, half)}
        assert delete_records(one.bootstrap, topic_name, {0: half - 1}) == {0: (0, half)}  # never back down
        assert "purged below" in one.log_text()
        assert listed(one.bootstrap, topic_name, OffsetSpec.EARLIEST) == half
        assert listed(one.bootstrap, topic_name, OffsetSpec.EARLIEST_LOCAL) == local_start
        assert listed(one.bootstrap, topic_name, 0) == half  # the first record at or after timestamp 0
        started = time.monotonic()
        wait_until(lambda: listed(two.bootstrap, topic_name, OffsetSpec.EARLIEST) == half,
                   "the second replica to know the purge", timeout=5, interval=0.02)
        print(f"second replica applied the purge after {time.monotonic() - started:.2f}s")
        assert time.monotonic() - started < 2
        for p in proxies:
            assert fetch_error(p.bootstrap, topic_name, half - 1) == ErrorCode.OFFSET_OUT_OF_RANGE
            assert fetch_error(p.bootstrap, topic_name, 0) == ErrorCode.OFFSET_OUT_OF_RANGE
            assert fetch_error(p.bootstrap, topic_name, half) == ErrorCode.NONE
        assert offsets_from_the_beginning(two.bootstrap, topic_name, hw) == list(range(half, hw))
        assert _spark_offsets(kafka.bootstrap, topic_name, s.storage, s.metadata) == list(range(half, hw))

        # the next tier pass deletes the segments wholly below; what is served stays the same
        before = tiered(s, topic_name)[0]
        summary = tier_once(s)
        below = [m for m in before if m.end_offset < half]
        assert below and summary.purged == len(below), summary
        after = tiered(s, topic_name)[0]
        assert after[0].start_offset <= half <= after[0].end_offset
    finally:
        for p in proxies:
            p.stop()

    # the same after restarting the broker and the proxy
    kafka.stop_node(kafka.nodes[0].node_id)
    kafka.start_node(kafka.nodes[0].node_id)
    fresh = replica(kafka.bootstrap, tmp_path, s.storage, s.metadata)
    try:
        wait_until(lambda: proxy_serves_tier(fresh.bootstrap, topic_name), "the restarted replica's tier", timeout=90)
        assert listed(fresh.bootstrap, topic_name, OffsetSpec.EARLIEST) == half
        assert fetch_error(fresh.bootstrap, topic_name, 0) == ErrorCode.OFFSET_OUT_OF_RANGE
        assert offsets_from_the_beginning(fresh.bootstrap, topic_name, hw)[:1] == [half]

        # -1 (the high watermark) purges everything, the tier included
        end = watermarks(kafka.bootstrap, topic_name)[1]
        assert delete_records(fresh.bootstrap, topic_name, {0: -1}) == {0: (0, end)}
        assert listed(fresh.bootstrap, topic_name, OffsetSpec.EARLIEST) == end
        assert fetch_error(fresh.bootstrap, topic_name, half) == ErrorCode.OFFSET_OUT_OF_RANGE
        assert tier_once(s).purged >= 1
        assert tiered(s, topic_name)[0] == []
    finally:
        fresh.stop()


def _log_start_of(s: Any, topic_id: bytes) -> int:
    async def read() -> int:
        rlmm = open_metadata(s.metadata, s.bootstrap_servers)
        await rlmm.start()
        try:
            pc = rlmm.cache.get(topic_id, 0)
            assert pc is not None
            return pc.log_start_offset
        finally:
            await rlmm.close()

    return asyncio.run(read())


def test_delete_records_touches_only_the_current_topic_id(fleet_kafka: KafkaCluster, tmp_path: Path,
                                                          topic_name: str) -> None:
    """The topic is deleted and created again under its name before the tier pass deletes the old id's history:
    a DeleteRecords for the new topic is the new topic's alone."""
    kafka = fleet_kafka
    s, _ = _tiered_topic(kafka, tmp_path, topic_name)
    old_id = tiered(s, topic_name)[0][0].tp.topic_id
    proxy = replica(kafka.bootstrap, tmp_path, s.storage, s.metadata)
    try:
        wait_until(lambda: proxy_serves_tier(proxy.bootstrap, topic_name), "the replica's tier", timeout=60)
        admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
        admin.delete_topics([topic_name])[topic_name].result(30)
        wait_until(lambda: topic_name not in admin.list_topics(timeout=5).topics, "the topic to be gone")
        wait_until(lambda: create_topic(kafka.bootstrap, topic_name) is None, "the topic created again")
        fill_topic(kafka.bootstrap, topic_name, 100)
        assert delete_records(proxy.bootstrap, topic_name, {0: 50}) == {0: (0, 50)}
        assert delete_records(proxy.bootstrap, topic_name, {0: 20}) == {0: (0, 50)}  # the broker's answer
        assert _log_start_of(s, old_id) == 0
    finally:
        proxy.stop()
