"""The tier's compaction engine: Kafka's LogCleaner rules, applied to a partition's tiered segments.

Pure: bytes in, bytes out, the time passed in. No Spark, no storage, no asyncio — the `tier` job calls it from a
Spark task per partition and records the result as KIP-405 metadata.

    plan_cleaning(segments, now_ms, config)      -> CleaningPlan | None   (LogCleanerManager: what is cleanable)
    clean_partition(plan, read_segment, now_ms, config, map_bytes=...)  -> CleanedSegment...  (Cleaner.doClean)

Rules (Kafka's, read from LogCleaner/Cleaner/OffsetMap/MemoryRecords.filterTo): per key the record with the highest
offset wins; a tombstone is kept until its delete horizon (KIP-534: stored in the batch); records of aborted
transactions are removed; a transaction marker is removed once its transaction's records are gone and its horizon
passed; each producer's last batch is kept (empty if all its records went); min.compaction.lag.ms,
max.compaction.lag.ms and min.cleanable.dirty.ratio are honoured; the key map is bounded by `map_bytes`
(log.cleaner.dedupe.buffer.size). Offsets never move: a batch kept whole keeps its exact bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from tierproxy.tier.indexes import AbortedTxn, ProducerEntry, SegmentFiles

MAX_LONG = 2**63 - 1


@dataclass(frozen=True)
class CleanerConfig:
    """A topic's cleaning settings, with Kafka's names (the `from_topic_configs` keys) and defaults."""

    delete_retention_ms: int = 86_400_000  # delete.retention.ms
    min_compaction_lag_ms: int = 0  # min.compaction.lag.ms
    max_compaction_lag_ms: int = MAX_LONG  # max.compaction.lag.ms
    min_cleanable_dirty_ratio: float = 0.5  # min.cleanable.dirty.ratio
    segment_bytes: int = 1 << 30  # segment.bytes: cleaned segments are grouped up to it

    @classmethod
    def from_topic_configs(cls, configs: Mapping[str, str]) -> CleanerConfig:
        """The settings from a topic's configs (DescribeConfigs' names); a missing key takes Kafka's default,
        a bad value raises ValueError naming the key and the value."""
        raise NotImplementedError


@dataclass(frozen=True)
class TierSegment:
    """A live, finished tier segment as the cleaner sees it."""

    segment_id: bytes
    start_offset: int  # the segment's range [start_offset, end_offset]; batches inside may have gaps
    end_offset: int
    max_timestamp_ms: int
    size: int
    cleaned: bool  # written by a tier compaction (so below the partition's cleaned point)


@dataclass(frozen=True)
class SegmentInput:
    """One segment's bytes as the cleaner reads them."""

    log: bytes | memoryview  # the segment's whole batches, in offset order
    aborted: Sequence[AbortedTxn] = ()  # its txn index: aborted transactions completed in the segment
    producers: Mapping[int, ProducerEntry] = field(default_factory=dict)  # its producer snapshot (may be empty)


@dataclass(frozen=True)
class CleaningPlan:
    """What one cleaning rewrites: `groups` of consecutive segments, each becoming one new segment covering
    exactly the group's [first start, last end]. `first_dirty_offset` is where the uncleaned part begins
    (the end of the cleaned prefix + 1); `dirty_ratio` is the ratio that made it due (or 0 when forced by
    max.compaction.lag.ms)."""

    groups: tuple[tuple[TierSegment, ...], ...]
    first_dirty_offset: int
    first_uncleanable_offset: int  # dirty segments from here on are not cleaned this time (lag, LSO)
    dirty_ratio: float
    forced_by_max_lag: bool


@dataclass
class CleanedSegment:
    """One new segment: it replaces `replaces` and covers exactly their offset range (offsets never move)."""

    replaces: tuple[TierSegment, ...]
    start_offset: int
    end_offset: int
    files: SegmentFiles  # log + offset/time/txn indexes, leader-epoch checkpoint, producer snapshot
    max_timestamp_ms: int
    leader_epochs: dict[int, int]  # epoch → first offset in this segment
    size: int  # bytes of the log


def plan_cleaning(segments: Sequence[TierSegment], now_ms: int, config: CleanerConfig) -> CleaningPlan | None:
    """The cleaning due for a partition's live segments (in offset order), or None: nothing to do (dirty ratio
    below min.cleanable.dirty.ratio and no record past max.compaction.lag.ms, or nothing older than
    min.compaction.lag.ms)."""
    raise NotImplementedError


def clean_partition(plan: CleaningPlan, read_segment: Callable[[TierSegment], SegmentInput], now_ms: int,
                    config: CleanerConfig, *, map_bytes: int) -> Iterator[CleanedSegment]:
    """Run one cleaning: the new segments, in offset order, each replacing one group of the plan.

    `map_bytes` bounds the key map (Kafka's log.cleaner.dedupe.buffer.size); when the map fills, the cleaning
    covers what the map covered (the groups past it are not yielded) and the rest waits for the next pass, as
    Kafka's cleaner does. `read_segment` may be called more than once for a segment (the map pass, then the
    copy pass)."""
    raise NotImplementedError


__all__ = ["CleanedSegment", "CleanerConfig", "CleaningPlan", "SegmentInput", "TierSegment", "clean_partition",
           "plan_cleaning"]
