"""The steps of replacing tier segments (the rules are `tier.replacement`'s): each step a KIP-405 metadata state,
each one safe to be killed after (a pause point per step, `pauses`: `started`, `uploaded`, `finished`, `retired`,
`deleting`); the next pass finishes or rolls back, and every offset is served by exactly one segment throughout.

    step                                           killed after it, the next pass
    start    COPY_SEGMENT_STARTED (new segment)   an orphan, never served: rolled back after tier.orphan.timeout.ms
    upload   its objects                           the same (its objects found by id)
    finish   COPY_SEGMENT_FINISHED: served, the    `retire_shadowed`: the old ones marked for deletion
             old ones shadowed
    retire   DELETE_SEGMENT_STARTED (old ones)     `delete_retired`, once tier.segment.delete.delay.ms has passed
    delete   objects, DELETE_SEGMENT_FINISHED      `delete_retired` again (deleting a missing object is fine)
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace

from protocol.records import iter_batches
from tierproxy.jobs.tiering.housekeeping import delete_segment
from tierproxy.jobs.tiering.pauses import pause_point
from tierproxy.tier.indexes import (
    SegmentBuilder,
    SegmentFiles,
    decode_producer_snapshot,
    decode_txn_index,
    encode_leader_epochs,
    encode_txn_index,
)
from tierproxy.tier.model import RemoteLogSegmentMetadata, SegmentState, new_uuid
from tierproxy.tier.replacement import epochs_within, replacement_of, tiles
from tierproxy.tier.rlmm import RemoteLogMetadataManager, now_ms, transition
from tierproxy.tier.rsm import IndexType, RemoteStorageManager

log = logging.getLogger("tierproxy.tier")
S = SegmentState


async def start(rlmm: RemoteLogMetadataManager, group: Sequence[RemoteLogSegmentMetadata],
                segment_id: bytes | None = None) -> RemoteLogSegmentMetadata:
    """Step 1: COPY_SEGMENT_STARTED for a new segment replacing `group` (served, consecutive segments; the range
    it finishes with may be a part of the group's, `finish`)."""
    served = _served_ids(rlmm, group[0])
    missing = [md.segment_id for md in group if md.segment_id.id not in served]
    if missing:
        raise ValueError(f"not served, cannot be replaced: {', '.join(map(str, missing))}")
    md = replacement_of(group, segment_id or new_uuid(), now_ms(), max_timestamp_ms=-1, size=0,
                        txn_index_empty=True)
    await rlmm.add_segment(md)
    pause_point("started")
    return md


@dataclass(frozen=True)
class NewSegment:
    """A new segment whose objects are up, under the id (and STARTED record) of `started`: its range and facts."""

    started: RemoteLogSegmentMetadata
    start_offset: int
    end_offset: int
    max_timestamp_ms: int
    size: int
    txn_index_empty: bool
    was_cleaned: bool = True  # False: no cleaning went over its records (`tier.replacement.cleaned`)


async def finish(rlmm: RemoteLogMetadataManager, rsm: RemoteStorageManager, group: Sequence[RemoteLogSegmentMetadata],
                 news: Sequence[NewSegment]) -> list[RemoteLogSegmentMetadata] | None:
    """Step 3, once the new segments' objects are up (step 2, `RemoteStorageManager.copy_segment`):
    COPY_SEGMENT_FINISHED for all of them in one metadata write, from which they are served in the group's place.
    They must cover the group's range exactly, one after another; and a group no longer wholly served (a purge or
    a deletion meanwhile) is not replaced: the new segments are rolled back (None)."""
    pause_point("uploaded")
    served = _served_ids(rlmm, group[0])
    spans = [(n.start_offset, n.end_offset) for n in news]
    exact = tiles(spans, group[0].start_offset, group[-1].end_offset)
    if not exact or any(md.segment_id.id not in served for md in group):
        log.warning("%s..%d: %s; the new segments rolled back", group[0].segment_id, group[-1].end_offset,
                    "the segments to replace are no longer all served" if exact else
                    f"the new segments {spans} do not cover them exactly")
        await roll_back(rlmm, rsm, news)
        return None
    now = now_ms()
    facts = [replace(replacement_of(group, n.started.segment_id.id, now, max_timestamp_ms=n.max_timestamp_ms,
                                    size=n.size, txn_index_empty=n.txn_index_empty,
                                    span=(n.start_offset, n.end_offset), was_cleaned=n.was_cleaned),
                     broker_leader_epoch=n.started.broker_leader_epoch) for n in news]
    done = await rlmm.finish_copies(facts)
    pause_point("finished")
    return done


async def roll_back(rlmm: RemoteLogMetadataManager, rsm: RemoteStorageManager, news: Sequence[NewSegment]) -> None:
    """New segments that will not replace their group (never finished, so never served): deleted with their
    objects, whatever start offset names them."""
    for n in news:
        await delete_segment(rlmm, rsm, _current(rlmm, n.started))


async def retire_shadowed(rlmm: RemoteLogMetadataManager) -> int:
    """Step 4, for every partition: DELETE_SEGMENT_STARTED for each finished segment a served replacement takes the
    place of (the pass that replaced them, or a rerun after a kill between steps 3 and 4). → how many."""
    n = 0
    for pc in list(rlmm.cache.partitions.values()):
        for md in pc.shadowed():
            await rlmm.update_segment(transition(md, S.DELETE_SEGMENT_STARTED))
            n += 1
    if n:
        pause_point("retired")
    return n


async def delete_retired(rlmm: RemoteLogMetadataManager, rsm: RemoteStorageManager, delay_ms: int,
                         now: int | None = None) -> int:
    """Step 5: the objects of every segment marked DELETE_SEGMENT_STARTED at least `delay_ms` ago
    (tier.segment.delete.delay.ms: a proxy whose view lags, or a read already under way, still reads them until
    then), then DELETE_SEGMENT_FINISHED. → how many."""
    cutoff = (now_ms() if now is None else now) - delay_ms
    n = 0
    for pc in list(rlmm.cache.partitions.values()):
        for md in list(pc.segments.values()):
            if md.state == S.DELETE_SEGMENT_STARTED and md.event_timestamp_ms <= cutoff:
                await rsm.delete_segment(md)
                if not md.segment_size_in_bytes:  # never finished (a finished one has its size): it may have named
                    await rsm.delete_by_id(md.tp, md.segment_id.id)  # its objects by another start, found by id
                pause_point("deleting")
                await rlmm.update_segment(transition(md, S.DELETE_SEGMENT_FINISHED))
                n += 1
    return n


async def replace_group(rlmm: RemoteLogMetadataManager, rsm: RemoteStorageManager,
                        group: Sequence[RemoteLogSegmentMetadata], files: SegmentFiles, *, was_cleaned: bool = False
                        ) -> list[RemoteLogSegmentMetadata] | None:
    """Steps 1 to 4 on the driver, for one group and its new segment's files (made by the caller, every batch
    inside the group's range)."""
    started = await start(rlmm, group)
    if not started.start_offset <= files.start_offset <= files.end_offset <= started.end_offset:
        await delete_segment(rlmm, rsm, started)
        raise ValueError(f"new segment {files.start_offset}..{files.end_offset} outside the range it replaces "
                         f"{started.start_offset}..{started.end_offset}")
    await rsm.copy_segment(started, files)
    done = await finish(rlmm, rsm, group, [NewSegment(started, started.start_offset, started.end_offset,
                                                      files.max_timestamp_ms, files.log_size,
                                                      files.txn_index_empty, was_cleaned)])
    if done is not None:
        await retire_shadowed(rlmm)
    return done


async def joined(rsm: RemoteStorageManager, group: Sequence[RemoteLogSegmentMetadata]) -> SegmentFiles:
    """The group's segments as one, every byte kept (a rewrite that cleans nothing: small segments merged): the
    batches in order, offset and time indexes made again, the aborted transactions of every txn index, the last
    segment's producer snapshot, the group's leader epochs."""
    builder = SegmentBuilder(base_offset=group[0].start_offset)  # the indexes count from the range's start
    aborted = []
    for md in group:
        log_bytes = await rsm.fetch_log(md, 0)
        for batch in iter_batches(log_bytes):
            builder.add(batch)
        aborted += decode_txn_index(await rsm.fetch_index(md, IndexType.TRANSACTION))
    files = builder.finish(end_offset=group[-1].end_offset)
    epochs = epochs_within(group, group[0].start_offset, group[-1].end_offset)
    snapshot = await rsm.fetch_index(group[-1], IndexType.PRODUCER_SNAPSHOT)
    return replace(files, txn_index=encode_txn_index(aborted), aborted=aborted, producer_snapshot=snapshot,
                   producers=decode_producer_snapshot(snapshot), leader_epochs=epochs,
                   leader_epoch_checkpoint=encode_leader_epochs(epochs))


def _served_ids(rlmm: RemoteLogMetadataManager, md: RemoteLogSegmentMetadata) -> set[bytes]:
    pc = rlmm.cache.get(md.tp.topic_id, md.tp.partition)
    return {m.segment_id.id for m in pc.finished()} if pc else set()


def _current(rlmm: RemoteLogMetadataManager, md: RemoteLogSegmentMetadata) -> RemoteLogSegmentMetadata:
    pc = rlmm.cache.get(md.tp.topic_id, md.tp.partition)
    assert pc is not None
    return pc.segments[md.segment_id.id]
