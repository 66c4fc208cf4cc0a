"""A topic deleted and created again under the same name never gets the old topic's tiered history (O item 9):
the proxy checks every by-name lookup (Fetch <= v12, ListOffsets, OffsetForLeaderEpoch) against the topic's current
id (learned from Metadata answers), and the tier job fetches by topic id (Fetch v13) and records that id."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from protocol.constants import ApiKey, OffsetSpec
from protocol.requests import list_offsets_request
from tests.support.kafka import broker_forgets, create_topic, small_segment_producer, small_segments
from tests.support.proxy import ProxyProcess
from tests.support.tiering import offsets_of, settings, tier_once, tiered
from tierproxy.dev.kafkadist import KafkaCluster
from tierproxy.kafka.wireclient import WireClient

pytestmark = [pytest.mark.kafka, pytest.mark.kcat, pytest.mark.spark]


def _produce(bootstrap: str, topic: str, values: list[str]) -> None:
    p = small_segment_producer(bootstrap)
    for v in values:
        p.produce(topic, v.encode())
    assert p.flush(30) == 0


def _kcat(kcat: str, bootstrap: str, topic: str, offset: int) -> list[str]:
    out = subprocess.run([kcat, "-b", bootstrap, "-C", "-t", topic, "-p", "0", "-o", str(offset), "-e", "-q",
                          "-f", "%o %s\n"], capture_output=True, text=True, timeout=120)
    return out.stdout.splitlines()


def _recreate(bootstrap: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.delete_topics([topic], operation_timeout=30)[topic].result(30)
    deadline = time.monotonic() + 60
    while True:
        try:
            create_topic(bootstrap, topic)
            return
        except Exception:  # the deletion is still under way
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def test_a_recreated_topic_never_serves_the_old_topics_history(kafka: KafkaCluster, tmp_path: Path,
                                                               topic_name: str, kcat: str) -> None:
    create_topic(kafka.bootstrap, topic_name, config={**small_segments(16 * 1024), "segment.ms": "300"})
    _produce(kafka.bootstrap, topic_name, [f"old-{i}" for i in range(2000)])
    s = settings(kafka.bootstrap, tmp_path, topic_name)
    assert tier_once(s).failed == 0
    broker_forgets(kafka.bootstrap, topic_name, above=1000)
    proxy = ProxyProcess(kafka.bootstrap, tmp_path, extra={"TIERPROXY_STORAGE": s.storage,
                                                           "TIERPROXY_METADATA": str(s.metadata)})
    try:
        assert _kcat(kcat, proxy.bootstrap, topic_name, 1500)[0] == "1500 old-1500"  # history, from the tier
        _recreate(kafka.bootstrap, topic_name)
        _produce(kafka.bootstrap, topic_name, [f"new-{i}" for i in range(10)])
        assert _kcat(kcat, proxy.bootstrap, topic_name, 0) == [f"{i} new-{i}" for i in range(10)]
        assert not any("old" in line for line in _kcat(kcat, proxy.bootstrap, topic_name, 1500))
        with WireClient(proxy.bootstrap) as w:
            resp = w.request(ApiKey.LIST_OFFSETS, 9, list_offsets_request(
                {topic_name: {0: OffsetSpec.LATEST_TIERED}}))
        assert resp["topics"][0]["partitions"][0]["offset"] == -1  # nothing of the new topic is tiered
    finally:
        proxy.stop()
    s = settings(kafka.bootstrap, tmp_path, topic_name, tier_topic_delete_delay_ms=0, confirm_retention=True)
    summary = tier_once(s)  # by topic id: the new topic's records under its new id; the old id's history deleted
    assert summary.failed == 0 and summary.partitions_deleted == 1, summary
    segs, raw, _ = tiered(s, topic_name)
    assert offsets_of(raw) == list(range(10)) and len({md.segment_id.tp.topic_id for md in segs}) == 1
