"""Replacing tier segments (a tier compaction's output taking the place of the segments it cleaned): the rules, once.

A replacement is a new segment covering exactly [first start, last end] of a group of consecutive served segments
of one partition (offsets never move). It goes through KIP-405's states as any copy does, and so do the segments
it replaces (`tiering.replace` runs the steps):

1. the new segment COPY_SEGMENT_STARTED, its objects uploaded, COPY_SEGMENT_FINISHED (a group may be replaced by
   two new segments, when a cleaning's key map filled inside its last segment: both finish in one metadata write);
2. each replaced segment DELETE_SEGMENT_STARTED (no longer served by anyone whose view has the record);
3. once `tier.segment.delete.delay.ms` has passed since (Kafka's `log.segment.delete.delay.ms`: a proxy whose
   metadata view lags, or a read already under way, still reads the old objects meanwhile), the objects are deleted,
   then DELETE_SEGMENT_FINISHED.

**Which segment answers while both are live** (between steps 1 and 2, and after a crash there): every segment
carries a *generation* in KIP-405's opaque custom metadata (`tierproxy.generation=N`; none: 0, a copy of the
broker's log); a replacement's is one more than the highest of those it replaces. A finished segment whose whole
range the finished segments of higher generations cover between them is **shadowed**: never served, whatever order
the records are read in (`PartitionCache` applies this, for the proxy, the Spark reader, Iceberg, restore and the
snapshots alike). So at every moment each offset is served by exactly one segment: the old ones until the
replacement's FINISHED is applied, the replacement from then on. A partial overlap shadows nothing (when in doubt,
keep data): the lookup by start offset then answers from the later start.

A replacement stays under its segment-id key in the metadata topic for its whole life (`serde.segment_id_key`): its
end offset is the last replaced segment's, whose KIP key (`topicId:partition:endOffset:brokerLeaderEpoch`) a record
of the replacement would overwrite.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence

from tierproxy.tier.model import LeaderEpochs, RemoteLogSegmentId, RemoteLogSegmentMetadata, SegmentState

_GENERATION = b"tierproxy.generation="
_UNCLEANED = b";uncleaned"  # a replacement whose records no cleaning has gone over (see `cleaned`)


def generation(md: RemoteLogSegmentMetadata) -> int:
    """The segment's generation: 0 for a copy of the broker's log, one more than the highest it replaced for a
    replacement (from its custom metadata; anything else there reads as 0)."""
    custom = md.custom_metadata
    if not custom or not custom.startswith(_GENERATION):
        return 0
    try:
        return int(custom[len(_GENERATION):].split(b";", 1)[0])
    except ValueError:
        return 0


def cleaned(md: RemoteLogSegmentMetadata) -> bool:
    """Whether a cleaning wrote the segment (below the partition's cleaned point, `TierSegment.cleaned`): a
    replacement, except the part of a segment past where a cleaning's key map filled, and a rewrite that keeps
    the bytes."""
    return generation(md) > 0 and not (md.custom_metadata or b"").endswith(_UNCLEANED)


def generation_metadata(gen: int, *, was_cleaned: bool = True) -> bytes:
    """The custom metadata naming generation `gen` (and, `was_cleaned` False, that no cleaning went over it)."""
    return _GENERATION + str(gen).encode() + (b"" if was_cleaned else _UNCLEANED)


def covered(loser: RemoteLogSegmentMetadata, winners: Iterable[RemoteLogSegmentMetadata]) -> bool:
    """Whether finished `winners` of higher generations than `loser` cover its whole range between them (each
    offset of it inside one of them): then they take its place."""
    gen = generation(loser)
    spans = sorted((w.start_offset, w.end_offset) for w in winners
                   if generation(w) > gen and w.segment_id != loser.segment_id
                   and w.start_offset <= loser.end_offset and w.end_offset >= loser.start_offset)
    reach = loser.start_offset - 1
    for start, end in spans:
        if start > reach + 1:
            return False
        reach = max(reach, end)
        if reach >= loser.end_offset:
            return True
    return False


def tiles(spans: Sequence[tuple[int, int]], start: int, end: int) -> bool:
    """Whether the (first, last offset) `spans`, in order, cover [start, end] exactly, one right after another:
    what the new segments replacing a group must do (never an offset served by neither, nor by two)."""
    reach = start - 1
    for first, last in spans:
        if first != reach + 1 or last < first:
            return False
        reach = last
    return bool(spans) and reach == end


def epochs_within(olds: Sequence[RemoteLogSegmentMetadata], start: int, end: int) -> dict[int, int]:
    """The leader epochs of [start, end] as the segments `olds` (covering it) record them, each from its first
    offset in the range: the epochs describe offsets, which a cleaning never moves."""
    out: dict[int, int] = {}
    for md in olds:
        for epoch, first, last in md.epoch_ranges():
            if first <= end and last >= start:
                out[epoch] = min(max(first, start), out.get(epoch, max(first, start)))
    return dict(sorted(out.items(), key=lambda kv: kv[1]))


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


def replacement_of(group: Sequence[RemoteLogSegmentMetadata], segment_id: bytes, event_timestamp_ms: int, *,
                   max_timestamp_ms: int, size: int, txn_index_empty: bool, span: tuple[int, int] | None = None,
                   was_cleaned: bool = True) -> RemoteLogSegmentMetadata:
    """The COPY_SEGMENT_STARTED metadata of a new segment replacing `group` (checked: `check_group`), or the part
    `span` (first, last offset) of it: its exact range, the group's epochs there, the next generation, the
    writer's epoch of the group's newest segment."""
    check_group(group)
    gen = max(generation(md) for md in group) + 1
    start, end = span or (group[0].start_offset, group[-1].end_offset)
    if not group[0].start_offset <= start <= end <= group[-1].end_offset:
        raise ValueError(f"{start}..{end} is not inside the group's {group[0].start_offset}..{group[-1].end_offset}")
    return RemoteLogSegmentMetadata(
        RemoteLogSegmentId(group[0].tp, segment_id), start, end, max_timestamp_ms, -1, event_timestamp_ms,
        LeaderEpochs(epochs_within(group, start, end)), size, SegmentState.COPY_SEGMENT_STARTED, txn_index_empty,
        generation_metadata(gen, was_cleaned=was_cleaned), max(md.broker_leader_epoch for md in group))
