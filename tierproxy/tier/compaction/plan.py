"""Which segments a cleaning rewrites (Kafka's LogCleanerManager.cleanableOffsets and LogToClean, with the
tier's segments: all finished, so no active segment; the cleaned prefix is the run of `cleaned` segments)."""

from __future__ import annotations

from collections.abc import Sequence

from tierproxy.tier.compaction.model import CleanerConfig, CleaningPlan, TierSegment

INT_MAX = 2**31 - 1


def plan_cleaning(segments: Sequence[TierSegment], now_ms: int, config: CleanerConfig, *,
                  last_stable_offset: int | None = None) -> CleaningPlan | None:
    """The cleaning due for a partition's live segments (in offset order), or None: nothing to do (dirty ratio
    not above min.cleanable.dirty.ratio and no record past max.compaction.lag.ms, or nothing older than
    min.compaction.lag.ms).

    `last_stable_offset` (the partition's LSO, when known) bounds the cleaning as Kafka's does: records of a
    transaction still open must not enter the key map."""
    segs = sorted(segments, key=lambda s: s.start_offset)
    if not segs:
        return None
    first_dirty_index = next((i for i, s in enumerate(segs) if not s.cleaned), len(segs))
    first_dirty = segs[first_dirty_index].start_offset if first_dirty_index < len(segs) else segs[-1].end_offset + 1
    bounds = [segs[-1].end_offset + 1]
    if last_stable_offset is not None:
        bounds.append(last_stable_offset)
    min_lag = max(config.min_compaction_lag_ms, 0)
    if min_lag > 0:
        young = next((s for s in segs[first_dirty_index:] if s.max_timestamp_ms > now_ms - min_lag), None)
        if young is not None:
            bounds.append(young.start_offset)
    uncleanable = max(first_dirty, min(bounds))
    # Kafka's calculateCleanableBytes: the first uncleanable offset is a segment's start
    uncleanable = next((s.start_offset for s in segs if s.end_offset >= uncleanable), uncleanable)
    clean_bytes = sum(s.size for s in segs[:first_dirty_index])
    dirty_bytes = sum(s.size for s in segs[first_dirty_index:] if s.start_offset < uncleanable)
    ratio = dirty_bytes / (clean_bytes + dirty_bytes) if clean_bytes + dirty_bytes else 0.0
    forced = _max_lag_due(segs[first_dirty_index:], now_ms, config)
    if not ((forced and dirty_bytes > 0) or ratio > config.min_cleanable_dirty_ratio):
        return None
    round_segs = [s for s in segs if s.start_offset < uncleanable]
    later = tuple(s for s in segs if s.start_offset >= uncleanable)
    return CleaningPlan(groups=group_by_size(round_segs, config.segment_bytes, uncleanable), later=later,
                        first_dirty_offset=first_dirty, first_uncleanable_offset=uncleanable, dirty_ratio=ratio,
                        forced_by_max_lag=forced and ratio <= config.min_cleanable_dirty_ratio)


def _max_lag_due(dirty: Sequence[TierSegment], now_ms: int, config: CleanerConfig) -> bool:
    # Kafka's maxCompactionDelay: the earliest first-batch timestamp (> 0) of the dirty segments before now - lag
    firsts = [s.max_timestamp_ms if s.first_batch_timestamp_ms is None else s.first_batch_timestamp_ms
              for s in dirty]
    earliest = min((t for t in firsts if t > 0), default=None)
    return earliest is not None and earliest < now_ms - max(config.max_compaction_lag_ms, 0)


def group_by_size(segs: Sequence[TierSegment], max_size: int,
                  first_uncleanable: int) -> tuple[tuple[TierSegment, ...], ...]:
    """Kafka's groupSegmentsBySize: consecutive segments while their sizes add up to at most segment.bytes and
    the offsets of a group stay within an int of its first (the index formats' relative offsets). A hole between
    two segments (offsets the tier does not hold: a lost copy) ends a group: a new segment covers exactly its
    group's range, and never claims offsets the tier does not hold (`tier.replacement.check_group`)."""
    groups: list[tuple[TierSegment, ...]] = []
    i = 0
    while i < len(segs):
        group = [segs[i]]
        size = segs[i].size
        i += 1
        while i < len(segs) and size + segs[i].size <= max_size and segs[i].start_offset == group[-1].end_offset + 1:
            last = segs[i + 1].start_offset - 1 if i + 1 < len(segs) else first_uncleanable - 1
            if segs[i].size and last - group[0].start_offset > INT_MAX:
                break
            group.append(segs[i])
            size += segs[i].size
            i += 1
        groups.append(tuple(group))
    return tuple(groups)
