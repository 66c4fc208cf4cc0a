"""Building blocks for tier tests: partitions, segment metadata."""

from __future__ import annotations

import os

from tierproxy.tier.model import (
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    SegmentState,
    TopicIdPartition,
)


def tp(topic: str = "orders", partition: int = 0, topic_id: bytes | None = None) -> TopicIdPartition:
    return TopicIdPartition(topic, topic_id or os.urandom(16), partition)


def seg(tip: TopicIdPartition, start: int, end: int, epochs: dict[int, int] | None = None, *,
        broker_epoch: int = 0, seg_id: bytes | None = None, ts: int = 1_000) -> RemoteLogSegmentMetadata:
    return RemoteLogSegmentMetadata(RemoteLogSegmentId(tip, seg_id or os.urandom(16)), start, end, ts + end, 101,
                                    ts, epochs or {0: start}, (end - start + 1) * 100,
                                    SegmentState.COPY_SEGMENT_STARTED, False, None, broker_epoch)
