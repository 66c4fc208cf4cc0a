"""tierproxy's own control-plane client against a real broker: several requests written at once come back in
order, each the answer it would get alone, and the connection stays usable."""

from __future__ import annotations

import asyncio

import pytest
from confluent_kafka import Producer

from protocol.constants import ApiKey, IsolationLevel, OffsetSpec
from protocol.requests import list_offsets_request, listed_offsets
from tests.support.kafka import create_topic
from tierproxy.dev.kafkadist import KafkaCluster
from tierproxy.kafka.asyncclient import AsyncWireClient

pytestmark = pytest.mark.kafka


def test_requests_written_together_are_answered_in_order(kafka: KafkaCluster, topic_name: str) -> None:
    create_topic(kafka.bootstrap, topic_name, partitions=2)
    p = Producer({"bootstrap.servers": kafka.bootstrap})
    for i in range(30):
        p.produce(topic_name, b"v", partition=i % 2)
    assert p.flush(30) == 0
    host, _, port = kafka.bootstrap.rpartition(":")
    asks = [(int(ApiKey.LIST_OFFSETS), 7, list_offsets_request({topic_name: {0: spec, 1: spec}}, isolation=iso))
            for iso, spec in ((IsolationLevel.READ_UNCOMMITTED, OffsetSpec.EARLIEST),
                              (IsolationLevel.READ_COMMITTED, OffsetSpec.LATEST),
                              (IsolationLevel.READ_UNCOMMITTED, OffsetSpec.LATEST))]
    asks.append((int(ApiKey.METADATA), 12, {"topics": [{"name": topic_name, "topic_id": bytes(16)}],
                                             "allow_auto_topic_creation": False}))

    async def run() -> tuple[list[dict[str, object]], list[dict[str, object]], dict[str, object]]:
        client = AsyncWireClient(host, int(port))
        try:
            together = await client.request_many(asks)
            alone = [await client.request(*ask) for ask in asks]
            after = await client.request(*asks[0])
            return together, alone, after
        finally:
            await client.close()

    together, alone, after = asyncio.run(run())
    assert [listed_offsets(a) for a in together[:3]] == [listed_offsets(a) for a in alone[:3]]
    assert listed_offsets(together[0]) == {(topic_name, 0): 0, (topic_name, 1): 0}
    assert listed_offsets(together[2]) == {(topic_name, 0): 15, (topic_name, 1): 15}
    assert [t["name"] for t in together[3]["topics"]] == [topic_name]  # type: ignore[index]
    assert listed_offsets(after) == listed_offsets(together[0])
