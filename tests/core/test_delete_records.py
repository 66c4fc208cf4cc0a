"""DeleteRecords in process: a purge moves a tiered log start only under the topic's current id asked at that
moment; when the cluster's answer does not name the topic, nothing of the tier moves and the client is told to
retry (KAFKA_STORAGE_ERROR), whatever id was remembered before."""

from __future__ import annotations

import os

from protocol.constants import ApiKey, ErrorCode
from tests.support.inprocess import InProcessProxy, Wire, run
from tests.support.memory_tier import InMemoryTier
from tierproxy.tier.model import TopicIdPartition

TOPIC, TID = "orders", os.urandom(16)
TP0 = TopicIdPartition(TOPIC, TID, 0)


def _purge(tier: InMemoryTier, offset: int) -> dict[str, int]:
    """DeleteRecords of partition 0 below `offset`; the broker (log start 500) answers its low watermark."""
    result: dict[str, int] = {}

    async def go() -> None:
        proxy = InProcessProxy(tier)
        wire = Wire(proxy)
        wire.client_sends(ApiKey.DELETE_RECORDS, 2, {"topics": [
            {"name": TOPIC, "partitions": [{"partition_index": 0, "offset": offset}]}], "timeout_ms": 5000})
        [(header, _)] = wire.broker_receives()
        wire.broker_answers(header, {"throttle_time_ms": 0, "topics": [
            {"name": TOPIC, "partitions": [{"partition_index": 0, "low_watermark": 500, "error_code": 0}]}]})
        await proxy.settle()
        [(_, _, body)] = wire.client_receives()
        assert body is not None
        result.update(body["topics"][0]["partitions"][0])

    run(go())
    return result


def _tier() -> InMemoryTier:
    tier = InMemoryTier()
    tier.segment(TP0, 0, 99)
    tier.current_ids[TOPIC] = TID
    return tier


def test_a_purge_into_the_tier_is_recorded_under_the_current_id() -> None:
    tier = _tier()
    got = _purge(tier, 50)
    assert (got["error_code"], got["low_watermark"]) == (ErrorCode.NONE, 50)
    assert tier.purges == [(TP0, 50)] and tier.refreshes == 1


def test_nothing_moves_when_the_cluster_does_not_name_the_topic_now() -> None:
    tier = _tier()
    tier.unnamed_on_refresh = {TOPIC}
    got = _purge(tier, 50)
    assert (got["error_code"], got["low_watermark"]) == (ErrorCode.KAFKA_STORAGE_ERROR, -1)
    assert tier.purges == [] and tier.cache.get(TID, 0) is not None
    assert tier.cache.get(TID, 0).earliest_offset() == 0  # type: ignore[union-attr]
