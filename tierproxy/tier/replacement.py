"""Replacing tier segments (a tier compaction's output taking the place of the segments it cleaned): the rules, once.

A replacement is a new segment covering exactly [first start, last end] of a group of consecutive served segments
of one partition (offsets never move). It goes through KIP-405's states as any copy does, and so do the segments
it replaces (`tiering.replace` runs the steps):

1. the new segment COPY_SEGMENT_STARTED, its objects uploaded, COPY_SEGMENT_FINISHED;
2. each replaced segment DELETE_SEGMENT_STARTED (no longer served by anyone whose view has the record);
3. once `tier.segment.delete.delay.ms` has passed since (Kafka's `log.segment.delete.delay.ms`: a proxy whose
   metadata view lags, or a read already under way, still reads the old objects meanwhile), the objects are deleted,
   then DELETE_SEGMENT_FINISHED.

**Which segment answers while both are live** (between steps 1 and 2, and after a crash there): every segment
carries a *generation* in KIP-405's opaque custom metadata (`tierproxy.generation=N`; none: 0, a copy of the
broker's log); a replacement's is one more than the highest of those it replaces. A finished segment lying wholly
inside the range of a finished segment of a higher generation is **shadowed**: never served, whatever order the
records are read in (`PartitionCache` applies this, for the proxy, the Spark reader, Iceberg, restore and the
snapshots alike). So at every moment each offset is served by exactly one segment: the old ones until the
replacement's FINISHED is applied, the replacement from then on. A partial overlap shadows nothing (when in doubt,
keep data): the lookup by start offset then answers from the later start.

A replacement stays under its segment-id key in the metadata topic for its whole life (`serde.segment_id_key`): its
end offset is the last replaced segment's, whose KIP key (`topicId:partition:endOffset:brokerLeaderEpoch`) a record
of the replacement would overwrite.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from tierproxy.tier.model import LeaderEpochs, RemoteLogSegmentId, RemoteLogSegmentMetadata, SegmentState

_GENERATION = b"tierproxy.generation="


def generation(md: RemoteLogSegmentMetadata) -> int:
    """The segment's generation: 0 for a copy of the broker's log, one more than the highest it replaced for a
    replacement (from its custom metadata; anything else there reads as 0)."""
    custom = md.custom_metadata
    if not custom or not custom.startswith(_GENERATION):
        return 0
    try:
        return int(custom[len(_GENERATION):])
    except ValueError:
        return 0


def generation_metadata(gen: int) -> bytes:
    """The custom metadata naming generation `gen`."""
    return _GENERATION + str(gen).encode()


def shadows(winner: RemoteLogSegmentMetadata, loser: RemoteLogSegmentMetadata) -> bool:
    """Whether finished `winner` takes `loser`'s place: a higher generation, and `loser` wholly inside its range."""
    return (generation(winner) > generation(loser) and winner.start_offset <= loser.start_offset
            and loser.end_offset <= winner.end_offset)


def check_group(group: Sequence[RemoteLogSegmentMetadata]) -> None:
    """A group a replacement may take the place of: finished segments of one partition, consecutive (each starts
    right after the previous one's end: nothing in between that the replacement would cover without holding it).
    ValueError names what is wrong."""
    if not group:
        raise ValueError("an empty group of segments to replace")
    tp = group[0].tp
    for md in group:
        if md.tp != tp:
            raise ValueError(f"{md.segment_id}: not of {tp}")
        if md.state != SegmentState.COPY_SEGMENT_FINISHED:
            raise ValueError(f"{md.segment_id}: {md.state.name}, not a finished segment")
    for before, after in itertools.pairwise(group):
        if after.start_offset != before.end_offset + 1:
            raise ValueError(f"{after.segment_id} starts at {after.start_offset}, not right after "
                             f"{before.segment_id}'s end {before.end_offset}")


def merged_epochs(group: Sequence[RemoteLogSegmentMetadata]) -> dict[int, int]:
    """The group's leader epochs as one segment's (epoch → its first offset in the group): the epochs describe
    offsets, which a cleaning never moves, so OffsetForLeaderEpoch over the tier answers as before."""
    epochs: dict[int, int] = {}
    for md in group:
        for epoch, first in md.segment_leader_epochs.items():
            epochs[epoch] = min(first, epochs.get(epoch, first))
    return dict(sorted(epochs.items(), key=lambda kv: kv[1]))


def replacement_of(group: Sequence[RemoteLogSegmentMetadata], segment_id: bytes, event_timestamp_ms: int, *,
                   max_timestamp_ms: int, size: int, txn_index_empty: bool) -> RemoteLogSegmentMetadata:
    """The COPY_SEGMENT_STARTED metadata of a new segment replacing `group` (checked: `check_group`): its exact
    range, the group's epochs, the next generation, the writer's epoch of the group's newest segment."""
    check_group(group)
    gen = max(generation(md) for md in group) + 1
    return RemoteLogSegmentMetadata(
        RemoteLogSegmentId(group[0].tp, segment_id), group[0].start_offset, group[-1].end_offset, max_timestamp_ms,
        -1, event_timestamp_ms, LeaderEpochs(merged_epochs(group)), size, SegmentState.COPY_SEGMENT_STARTED,
        txn_index_empty, generation_metadata(gen), max(md.broker_leader_epoch for md in group))
