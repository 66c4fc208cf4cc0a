"""The tier's compaction engine: Kafka's LogCleaner rules, applied to a partition's tiered segments.

Pure: bytes in, bytes out, the time passed in. No Spark, no storage, no asyncio — the `tier` job calls it from a
Spark task per partition and records the result as KIP-405 metadata.

    plan_cleaning(segments, now_ms, config, last_stable_offset=None) -> CleaningPlan | None
        (LogCleanerManager: what is cleanable; pass the partition's LSO when a transaction may be open)
    clean_partition(plan, read_segment, now_ms, config, map_bytes=..., kernel=PYTHON)
        -> CleanedSegment...  (Cleaner.doClean; `kernel`: the per-record loops, `kernel.PYTHON` or the tier job's
        compiled one, which decide alike)
        one CleanedSegment per group of the plan, in order; `files` None when every batch of the group went;
        when the key map fills (or a transaction the tier holds no marker for begins), the groups past it are not
        yielded and the group it ended in is written in two: what the map covered, then the rest of the group
        (`cleaned` False, `replaces` empty; the segments wholly past it byte for byte) — so a group is always
        replaced whole, and the next cleaning goes on from there.

Rules (Kafka's, read from LogCleaner/Cleaner/OffsetMap/MemoryRecords.filterTo): per key the record with the highest
offset wins; a tombstone is kept until its delete horizon (KIP-534: stored in the batch); records of aborted
transactions are removed; a transaction marker is removed once its transaction's records are gone and its horizon
passed; each producer's last batch is kept (empty if all its records went); min.compaction.lag.ms,
max.compaction.lag.ms and min.cleanable.dirty.ratio are honoured; the key map is bounded by `map_bytes`
(log.cleaner.dedupe.buffer.size). Offsets never move: a batch kept whole keeps its exact bytes.
"""

from __future__ import annotations

from tierproxy.tier.compaction.clean import MapTooSmall, clean_partition
from tierproxy.tier.compaction.model import (
    CleanedSegment,
    CleanerConfig,
    CleaningPlan,
    SegmentInput,
    TierSegment,
)
from tierproxy.tier.compaction.offset_map import BYTES_PER_ENTRY, OffsetMap
from tierproxy.tier.compaction.plan import plan_cleaning

__all__ = ["BYTES_PER_ENTRY", "CleanedSegment", "CleanerConfig", "CleaningPlan", "MapTooSmall", "OffsetMap",
           "SegmentInput", "TierSegment", "clean_partition", "plan_cleaning"]
