"""The driver's lifecycle work besides copying: orphans, remote retention, deleted topics.

Each deletion follows KIP-405: DELETE_SEGMENT_STARTED → delete the objects → DELETE_SEGMENT_FINISHED (the RLMM
then tombstones the segment's keys); a topic id gone from the cluster goes DELETE_PARTITION_MARKED → STARTED →
every segment deleted → FINISHED.
"""

from __future__ import annotations

import logging
import time

from tierproxy.tier.model import (
    PartitionDeleteState,
    RemoteLogSegmentMetadata,
    RemotePartitionDeleteMetadata,
    SegmentState,
)
from tierproxy.tier.rlmm import RemoteLogMetadataManager, now_ms, transition
from tierproxy.tier.rsm import RemoteStorageManager

log = logging.getLogger("tierproxy.tier")
S = SegmentState
P = PartitionDeleteState


async def delete_segment(rlmm: RemoteLogMetadataManager, rsm: RemoteStorageManager,
                         md: RemoteLogSegmentMetadata) -> None:
    if md.state != S.DELETE_SEGMENT_STARTED:
        md = await rlmm.update_segment(transition(md, S.DELETE_SEGMENT_STARTED))
    await rsm.delete_segment(md)
    await rsm.delete_by_id(md.tp, md.segment_id.id)  # objects a copy named by another start offset
    await rlmm.update_segment(transition(md, S.DELETE_SEGMENT_FINISHED))


async def clean_orphans(rlmm: RemoteLogMetadataManager, rsm: RemoteStorageManager, timeout_ms: int,
                        live_ids: set[bytes] = frozenset()) -> int:  # type: ignore[assignment]
    """Delete segments stuck in COPY_SEGMENT_STARTED (or DELETE_SEGMENT_STARTED) for longer than the timeout."""
    cutoff = now_ms() - timeout_ms
    n = 0
    for pc in list(rlmm.cache.partitions.values()):
        for md in list(pc.segments.values()):
            if md.segment_id.id in live_ids or md.event_timestamp_ms > cutoff:
                continue
            if md.state in (S.COPY_SEGMENT_STARTED, S.DELETE_SEGMENT_STARTED):
                log.warning("cleaning orphan segment %s (%s since %d)", md.segment_id, md.state.name,
                            md.event_timestamp_ms)
                await delete_segment(rlmm, rsm, md)
                n += 1
    return n


async def enforce_retention(rlmm: RemoteLogMetadataManager, rsm: RemoteStorageManager,
                            retention: dict[str, tuple[int, int]], log_starts: dict[tuple[str, int], int]) -> int:
    """Per topic (retention.ms, retention.bytes), -1 = unlimited: delete the oldest segments beyond them.

    As Kafka's `deletableSegments`: from the oldest segment onward, stopping at the first one kept, so a newer
    segment with older timestamps is never deleted behind a kept one (that would cut a hole in the history).
    Segments wholly below a purged log start (`record_purges`) go first, whatever the retention. Otherwise only
    segments wholly below the broker's log start are eligible: the tier never keeps less history than the
    broker (a remote copy of data the broker still has would only be copied again by the next pass).
    """
    now = int(time.time() * 1000)
    n = 0
    for pc in list(rlmm.cache.partitions.values()):
        if rlmm.cache.is_deleted(pc.tp.topic_id, pc.tp.partition):
            continue
        ms, max_bytes = retention.get(pc.tp.topic, (-1, -1))
        log_start = log_starts.get((pc.tp.topic, pc.tp.partition), 0)
        for md in pc.purged():  # below a purged log start, whatever the retention (isSegmentBreachByLogStartOffset)
            log.info("purged: deleting %s (offsets %d..%d, below log start %d)", md.segment_id, md.start_offset,
                     md.end_offset, pc.log_start_offset)
            await delete_segment(rlmm, rsm, md)
            n += 1
        segments = sorted(pc.finished(), key=lambda m: m.start_offset)
        total = sum(md.segment_size_in_bytes for md in segments)
        for md in segments:
            by_time = ms >= 0 and md.max_timestamp_ms < now - ms
            by_size = max_bytes >= 0 and total > max_bytes
            if not (by_time or by_size) or md.end_offset >= log_start:
                break  # the first segment kept ends the deletion
            total -= md.segment_size_in_bytes
            log.info("remote retention: deleting %s (offsets %d..%d)", md.segment_id, md.start_offset, md.end_offset)
            await delete_segment(rlmm, rsm, md)
            n += 1
    return n


def never_deleted_by_retention(config: dict[str, str]) -> bool:
    """The broker deletes nothing of this topic by retention (`retention.ms` and `retention.bytes` both -1, as
    Kafka Streams creates its repartition topics, or no `delete` cleanup policy): its log start moves only by
    DeleteRecords."""
    if "delete" not in config.get("cleanup.policy", "delete"):
        return True
    return int(config.get("retention.ms", "604800000")) < 0 and int(config.get("retention.bytes", "-1")) < 0


async def record_purges(rlmm: RemoteLogMetadataManager, log_starts: dict[tuple[bytes, int, str], int],
                        configs: dict[str, dict[str, str]]) -> int:
    """Record as purges the broker log starts of tiered partitions whose topic the broker never deletes by
    retention (so a moved log start can only be DeleteRecords): the tier serves nothing below them again and
    `enforce_retention` deletes the segments wholly below. Where retention may have deleted, a moved log start
    is taken as retention (the tier goes on serving below it): only a purge that passes through the proxy is
    known there. Returns how many partitions' log starts moved."""
    n = 0
    for (topic_id, partition, topic), log_start in log_starts.items():
        pc = rlmm.cache.get(topic_id, partition)
        if pc is None or log_start <= pc.log_start_offset or not never_deleted_by_retention(configs.get(topic, {})):
            continue
        if await rlmm.put_log_start(pc.tp, log_start):
            log.info("%s-%d: log start %d moved by DeleteRecords (the topic has no retention): nothing below it is "
                     "served", topic, partition, log_start)
            n += 1
    return n


async def delete_gone_topics(rlmm: RemoteLogMetadataManager, rsm: RemoteStorageManager,
                             cluster_topic_ids: set[bytes], broker_id: int = -1) -> int:
    """Every tiered partition whose topic id is no longer in the cluster is deleted from the tier."""
    n = 0
    for (topic_id, partition), pc in list(rlmm.cache.partitions.items()):
        if topic_id in cluster_topic_ids:
            continue
        current = rlmm.cache.deletions.get((topic_id, partition))
        state = current.state if current else None
        if state == P.DELETE_PARTITION_FINISHED:
            continue
        log.warning("topic %s (id gone from the cluster): deleting partition %d from the tier", pc.tp.topic, partition)
        for target in (P.DELETE_PARTITION_MARKED, P.DELETE_PARTITION_STARTED):
            if state is None or state < target:
                await rlmm.put_partition_delete(RemotePartitionDeleteMetadata(pc.tp, target, now_ms(), broker_id))
        for md in list(pc.segments.values()):
            await delete_segment(rlmm, rsm, md)
        await rlmm.put_partition_delete(RemotePartitionDeleteMetadata(pc.tp, P.DELETE_PARTITION_FINISHED, now_ms(),
                                                                      broker_id))
        n += 1
    return n
