"""The compaction engine's types: a topic's cleaning settings, the segments it sees, its plan and its output."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from tierproxy.config.propfile import ConfigError
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
    # producer.id.expiration.ms (a broker setting, so a topic's DescribeConfigs never carries it: Kafka's default
    # stands): a producer idle this long, with no open transaction, is no longer active, so its last batch need not
    # be kept, and the cleaning forgets it (producers.py)
    producer_id_expiration_ms: int = 86_400_000

    @classmethod
    def from_topic_configs(cls, configs: Mapping[str, str]) -> CleanerConfig:
        """The settings from a topic's configs (DescribeConfigs' names); a missing key takes Kafka's default, a
        bad value raises ConfigError naming the key, the value and the reason."""
        d = cls()
        return cls(
            delete_retention_ms=_int(configs, "delete.retention.ms", d.delete_retention_ms, 0),
            min_compaction_lag_ms=_int(configs, "min.compaction.lag.ms", d.min_compaction_lag_ms, 0),
            max_compaction_lag_ms=_int(configs, "max.compaction.lag.ms", d.max_compaction_lag_ms, 1),
            min_cleanable_dirty_ratio=_ratio(configs, "min.cleanable.dirty.ratio", d.min_cleanable_dirty_ratio),
            segment_bytes=_int(configs, "segment.bytes", d.segment_bytes, 14),  # Kafka's least segment.bytes
            producer_id_expiration_ms=_int(configs, "producer.id.expiration.ms", d.producer_id_expiration_ms, 1))


def _int(configs: Mapping[str, str], key: str, default: int, least: int) -> int:
    raw = configs.get(key)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{key}={raw!r}: not an integer") from None
    if value < least:
        raise ConfigError(f"{key}={raw!r}: must be at least {least}")
    return value


def _ratio(configs: Mapping[str, str], key: str, default: float) -> float:
    raw = configs.get(key)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{key}={raw!r}: not a number") from None
    if not 0.0 <= value <= 1.0:
        raise ConfigError(f"{key}={raw!r}: must be between 0 and 1")
    return value


@dataclass(frozen=True)
class TierSegment:
    """A live, finished tier segment as the cleaner sees it."""

    segment_id: bytes
    start_offset: int  # the segment's range [start_offset, end_offset]; batches inside may have gaps
    end_offset: int
    max_timestamp_ms: int
    size: int
    cleaned: bool  # written by a tier compaction (so below the partition's cleaned point)
    # the max timestamp of the segment's first batch (Kafka's max.compaction.lag.ms measures from it); None:
    # unknown, the segment's max timestamp stands in (never earlier than Kafka would clean)
    first_batch_timestamp_ms: int | None = None


@dataclass(frozen=True)
class SegmentInput:
    """One segment's bytes as the cleaner reads them."""

    log: bytes | memoryview  # the segment's whole batches, in offset order
    aborted: Sequence[AbortedTxn] = ()  # its txn index: aborted transactions completed in the segment
    producers: Mapping[int, ProducerEntry] = field(default_factory=dict)  # its producer snapshot (may be empty)


@dataclass(frozen=True)
class CleaningPlan:
    """What one cleaning rewrites: `groups` of consecutive segments, each becoming one new segment covering
    exactly the group's [first start, last end] (Kafka's `groupSegmentsBySize`). The groups hold every segment
    below `first_uncleanable_offset` — the cleaned prefix too, as Kafka's cleaner recopies it (tombstones whose
    horizon passed go) — and `later` the segments from there on: read for their aborted transactions and
    producers, never rewritten."""

    groups: tuple[tuple[TierSegment, ...], ...]
    later: tuple[TierSegment, ...]
    first_dirty_offset: int  # where the uncleaned part begins (the end of the cleaned prefix + 1)
    first_uncleanable_offset: int  # nothing from here on is cleaned this time (min.compaction.lag.ms, LSO)
    dirty_ratio: float  # dirty bytes / all bytes below first_uncleanable_offset
    forced_by_max_lag: bool  # due by max.compaction.lag.ms rather than by the ratio

    @property
    def segments(self) -> tuple[TierSegment, ...]:
        return tuple(s for g in self.groups for s in g)


@dataclass
class CleanedSegment:
    """One new segment. It replaces `replaces` and covers exactly their offset range (offsets never move) —
    except when the key map filled (or an undecided transaction began) inside a group: the group is then written
    as two, the part the map covered (ending this segment, `cleaned` True, `replaces` the whole group) and the
    rest of the group (`cleaned` False, `replaces` empty: the segment before names the sources) — the rest of the
    segment the map ended in with the records this cleaning kept unless aborted, the segments wholly past it as
    they were. Together they cover the group's range exactly."""

    replaces: tuple[TierSegment, ...]
    start_offset: int
    end_offset: int
    files: SegmentFiles | None  # None: every batch of the range went (a range with no batch is no hole)
    max_timestamp_ms: int  # -1 with no batch
    leader_epochs: dict[int, int]  # epoch → first offset, as in the source segments (the metadata's epochs)
    size: int  # bytes of the log
    cleaned: bool = True
