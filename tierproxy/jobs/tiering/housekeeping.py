"""The driver's lifecycle work besides copying: orphans, purges and the tier's retention (the rules are
`tier.rules`'s), deleted topics (only those the cluster says are gone).

Each deletion follows KIP-405: DELETE_SEGMENT_STARTED → delete the objects → DELETE_SEGMENT_FINISHED (the RLMM
then tombstones the segment's keys); a topic id gone from the cluster goes DELETE_PARTITION_MARKED → STARTED →
every segment deleted → FINISHED.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field

from tierproxy.tier.cache import PartitionCache
from tierproxy.tier.model import (
    PartitionDeleteState,
    RemoteLogSegmentMetadata,
    RemotePartitionDeleteMetadata,
    SegmentState,
    uuid_str,
)
from tierproxy.tier.rlmm import RemoteLogMetadataManager, now_ms, transition
from tierproxy.tier.rsm import RemoteStorageManager
from tierproxy.tier.rules import deletion_guard, expired_segments, retention_guard, tier_retention_guard

log = logging.getLogger("tierproxy.tier")
S = SegmentState
P = PartitionDeleteState


async def delete_segment(rlmm: RemoteLogMetadataManager, rsm: RemoteStorageManager,
                         md: RemoteLogSegmentMetadata) -> None:
    copied = md.state == S.COPY_SEGMENT_FINISHED  # its objects are named by its (copied) start offset
    if md.state != S.DELETE_SEGMENT_STARTED:
        md = await rlmm.update_segment(transition(md, S.DELETE_SEGMENT_STARTED))
    await rsm.delete_segment(md)
    if not copied:  # a copy that never finished may have named its objects by another start offset: a listing
        await rsm.delete_by_id(md.tp, md.segment_id.id)  # of the partition finds them (not paid per deletion)
    await rlmm.update_segment(transition(md, S.DELETE_SEGMENT_FINISHED))


async def clean_orphans(rlmm: RemoteLogMetadataManager, rsm: RemoteStorageManager, timeout_ms: int,
                        live_ids: set[bytes] = frozenset()) -> int:  # type: ignore[assignment]
    """Delete segments stuck in COPY_SEGMENT_STARTED for longer than the timeout (a killed or failed copy's).
    Segments left DELETE_SEGMENT_STARTED are `replace.delete_retired`'s, after tier.segment.delete.delay.ms."""
    cutoff = now_ms() - timeout_ms
    n = 0
    aborted = await rsm.clean_incomplete(timeout_ms / 1000)
    if aborted:
        log.warning("removed %d unfinished uploads older than %d ms (a killed copy's)", aborted, timeout_ms)
    for pc in list(rlmm.cache.partitions.values()):
        for md in list(pc.segments.values()):
            if md.segment_id.id in live_ids or md.event_timestamp_ms > cutoff:
                continue
            if md.state == S.COPY_SEGMENT_STARTED:
                log.warning("cleaning orphan segment %s (%s since %d)", md.segment_id, md.state.name,
                            md.event_timestamp_ms)
                await delete_segment(rlmm, rsm, md)
                n += 1
    return n


@dataclass
class RetentionResult:
    expired: int = 0  # segments deleted by the tier's retention
    purged: int = 0  # segments deleted wholly below a recorded purge
    refused: list[str] = field(default_factory=list)  # partitions where retention would delete too much at once


async def enforce_retention(rlmm: RemoteLogMetadataManager, rsm: RemoteStorageManager,
                            retention: dict[str, tuple[int, int]], log_starts: dict[tuple[str, int], int],
                            max_delete_fraction: float = 1.0, confirmed: bool = False) -> RetentionResult:
    """Delete what the rules of `tier.rules` say goes: segments wholly below a recorded purge, then, per topic
    (tier retention.ms, retention.bytes; -1 = unlimited), the oldest segments beyond them that lie wholly below
    the broker's log start (`log_starts`; a partition the broker did not answer for deletes nothing by
    retention). More than `max_delete_fraction` of a partition's bytes at once (a partition of three or more
    segments), or of the whole tier's bytes (every partition's deletions together), is refused unless `confirmed`:
    refused over the whole tier, nothing is deleted by retention in this pass."""
    out = RetentionResult()
    now = int(time.time() * 1000)
    plan: list[tuple[PartitionCache, list[RemoteLogSegmentMetadata], list[RemoteLogSegmentMetadata]]] = []
    for pc in list(rlmm.cache.partitions.values()):
        if rlmm.cache.is_deleted(pc.tp.topic_id, pc.tp.partition):
            continue
        for md in pc.purged():  # below a purged log start, whatever the retention (isSegmentBreachByLogStartOffset)
            log.info("purged: deleting %s (offsets %d..%d, below log start %d)", md.segment_id, md.start_offset,
                     md.end_offset, pc.log_start_offset)
            await delete_segment(rlmm, rsm, md)
            out.purged += 1
        served = list(pc.finished())
        ms, max_bytes = retention.get(pc.tp.topic, (-1, -1))
        broker_start = log_starts.get((pc.tp.topic, pc.tp.partition))
        expiring = [] if (ms < 0 and max_bytes < 0) or broker_start is None else expired_segments(
            served, ms, max_bytes, now, broker_start)
        plan.append((pc, served, expiring))
    whole = None if confirmed else tier_retention_guard(
        [md for _, _, expiring in plan for md in expiring], [md for _, served, _ in plan for md in served],
        max_delete_fraction)
    if whole is not None:
        log.error("%s", whole)
        out.refused.append(f"the whole tier: {whole}")
        return out
    for pc, served, expiring in plan:
        if not expiring:
            continue
        refusal = retention_guard(expiring, served, max_delete_fraction) if not confirmed else None
        if refusal is not None:
            log.error("%s-%d: %s", pc.tp.topic, pc.tp.partition, refusal)
            out.refused.append(f"{pc.tp.topic}-{pc.tp.partition}: {refusal}")
            continue
        for md in expiring:
            log.info("tier retention: deleting %s (offsets %d..%d)", md.segment_id, md.start_offset, md.end_offset)
            await delete_segment(rlmm, rsm, md)
            out.expired += 1
    return out


async def delete_gone_topics(rlmm: RemoteLogMetadataManager, rsm: RemoteStorageManager, gone_ids: set[bytes],
                             max_delete_fraction: float = 1.0, confirmed: bool = False, broker_id: int = -1
                             ) -> tuple[int, str | None]:
    """Delete every tiered partition of the topic ids `gone_ids` (proven deleted: `tier.rules`'s rule 3).
    More than `max_delete_fraction` of the whole tier's bytes at once is refused unless `confirmed`.
    → (partitions deleted, the refusal or None)."""
    finished = {k for k, d in rlmm.cache.deletions.items() if d.state == P.DELETE_PARTITION_FINISHED}
    doomed = [(key, pc) for key, pc in rlmm.cache.partitions.items() if key[0] in gone_ids and key not in finished]
    if not doomed:
        return 0, None
    tier_bytes = sum(md.segment_size_in_bytes for pc in rlmm.cache.partitions.values() for md in pc.finished())
    doomed_bytes = sum(md.segment_size_in_bytes for _, pc in doomed for md in pc.finished())
    refusal = None if confirmed else deletion_guard("deleting the tiered partitions of deleted topics",
                                                     doomed_bytes, tier_bytes, max_delete_fraction)
    if refusal is not None:
        log.error("%s", refusal)
        return 0, refusal
    n = 0
    for (topic_id, partition), pc in doomed:
        current = rlmm.cache.deletions.get((topic_id, partition))
        state = current.state if current else None
        log.warning("topic %s (id %s: the cluster answers UNKNOWN_TOPIC_ID): deleting partition %d from the tier",
                    pc.tp.topic, uuid_str(topic_id), partition)
        for target in (P.DELETE_PARTITION_MARKED, P.DELETE_PARTITION_STARTED):
            if state is None or state < target:
                await rlmm.put_partition_delete(RemotePartitionDeleteMetadata(pc.tp, target, now_ms(), broker_id))
        for md in list(pc.segments.values()):
            await delete_segment(rlmm, rsm, md)
        await rlmm.put_partition_delete(RemotePartitionDeleteMetadata(pc.tp, P.DELETE_PARTITION_FINISHED, now_ms(),
                                                                      broker_id))
        n += 1
    return n, None


@dataclass
class ShortFiles:
    recopied: int = 0  # segments whose file was short while the broker held them: deleted, copied again this pass
    lost: list[str] = field(default_factory=list)  # short, and the broker no longer holds them


async def recopy_short_files(rlmm: RemoteLogMetadataManager, rsm: RemoteStorageManager,
                             log_starts: dict[tuple[str, int], int]) -> ShortFiles:
    """A `file://` tier after a crash (power loss before the data reached the disk, on a system without the
    fsync `FileStore.put` now does): a finished segment whose log file is missing or shorter than its metadata
    says is deleted from the tier (metadata and objects) when the broker still holds every offset of it
    (`log_starts`), so this pass copies it again; when it does not, it is kept and reported lost. Objects on S3 are
    durable once written: nothing to check there."""
    out = ShortFiles()
    for pc in list(rlmm.cache.partitions.values()):
        if rlmm.cache.is_deleted(pc.tp.topic_id, pc.tp.partition):
            continue
        for md in list(pc.finished()):
            path = rsm.log_file(md)
            if path is None:
                return out  # not a file tier
            try:
                size = os.stat(path).st_size
            except FileNotFoundError:
                size = -1
            if size >= md.segment_size_in_bytes:
                continue
            broker_start = log_starts.get((pc.tp.topic, pc.tp.partition))
            if broker_start is not None and broker_start <= md.start_offset:
                log.error("%s: its file holds %d of %d bytes (written before a crash?): the broker still holds "
                          "offsets %d..%d, copying them again", md.segment_id, max(size, 0),
                          md.segment_size_in_bytes, md.start_offset, md.end_offset)
                await delete_segment(rlmm, rsm, md)
                out.recopied += 1
            else:
                out.lost.append(f"{pc.tp.topic}-{pc.tp.partition} offsets {md.start_offset}..{md.end_offset}: "
                                f"file holds {max(size, 0)} of {md.segment_size_in_bytes} bytes")
                log.error("LOST %s", out.lost[-1])
    return out
