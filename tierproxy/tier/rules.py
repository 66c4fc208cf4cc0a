"""The tier's rules, each in one place: what moves a partition's log start, what deletes tier data, what the
tier serves (its segments, its first offset), what a gap and the tiering lag are.

The log start of a tiered partition is one durable fact, recorded in the metadata (`RemoteLogStartOffset`) and
applied by every reader of it (each proxy replica, the tier job, the Spark reader). Only three things delete
history from the tier, and nothing else ever does:
1. a **purge**: DeleteRecords through a proxy, recorded before its answer goes back (`delete_records_outcome`);
2. the **tier's own retention** (`tier.retention.ms` / `tier.retention.bytes`, per topic in
   `tier.topic.overrides`; default -1, keep forever), and only of segments wholly below the broker's log start
   (`expired_segments`), with guards against a mistyped value per partition (`retention_guard`) and over the
   whole tier (`tier_retention_guard`);
3. the deletion of the topic, proven: the cluster (the one the tier belongs to, `tier.ownership`) answered
   UNKNOWN_TOPIC_ID for the topic's id in passes at least `tier.topic.delete.delay.ms` apart
   (`topic_deletions_due`); a topic missing from a Metadata answer, or one the principal may not describe, stays.
   An id the tier inherited from a lost cluster (`tierproxy restore`, `model.TopicMount`) is proven deleted only
   through the restored topic's id in the cluster that owns the tier now; one left out of the restore stays.
(Besides these, a `file://` tier's segment whose file is found shorter than its metadata says — a crash before the
data reached the disk — is deleted from the tier to be copied again, only while the broker still holds every
offset of it: `tiering.housekeeping.recopy_short_files`; and the tier's compaction of a compacted topic replaces
segments by their cleaned version, removing only what Kafka's cleaner removes, every offset served throughout:
`tier.replacement`.)
The broker's own retention (its topic `retention.*`, Kafka's `local.retention.*`) moves the *broker's* log start
only: a move that no recorded purge explains is never taken for a purge, and the tier keeps serving below it.

A segment's range is the range the tier job planned for it (`segment_range`), not only its batches', as a broker's
segment runs from its base offset up to the next segment's: in a compacted log (`cleanup.policy` with `compact`)
batches have offset gaps inside and between them, and an offset the log cleaner removed lies inside a segment like
any other. So the tier stays contiguous, and compaction is never taken for a hole or a gap. What the broker
deleted before it was tiered is a gap there as anywhere. A tombstone the broker's cleaner removed after the
topic's `delete.retention.ms`, before the tier copied it, is gone from the tier too: a deleted key's older
value tiered earlier stands there. `tombstones_at_risk` says when a pass may have missed one.

What a gap is, also once, here: offsets neither the tier serves nor the broker holds (the broker deleted them
before they were tiered). A **hole** between tiered segments (a copy that failed) is not a gap while the broker
still holds any of it: the next tiering pass fills it. A reader never skips what either holds
(`resume_offset`), and neither the Iceberg ledger nor the tier's compaction moves past a hole that may still be
filled (`first_open_hole`, `cleaning_bound`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from protocol.records import RecordBatch
from tierproxy.tier.model import RemoteLogSegmentMetadata

HIGH_WATERMARK = -1  # DeleteRecords' offset -1: up to the high watermark


@dataclass(frozen=True, slots=True)
class DeleteRecordsOutcome:
    """What one partition of a DeleteRecords answers, and the log start to record first (None: nothing)."""

    low_watermark: int
    record: int | None


def delete_records_outcome(requested: int, broker_low_watermark: int, tier_earliest: int | None
                           ) -> DeleteRecordsOutcome:
    """One partition the broker answered without error (its answer authorizes the purge), as Kafka with tiered
    storage answers it (`UnifiedLog.deleteRecords` → `maybeIncrementLogStartOffset` over the whole log):

    - an offset the broker applied (at or above its log start, or -1 = its high watermark): the broker's new
      log start, recorded too, so the tier stops serving below it;
    - an offset below the broker's log start, inside what the tier serves (`tier_earliest` is the tier's first
      served offset): that offset becomes the log start, never below the current one;
    - at or below the tier's current start: nothing moves; the answer is the current log start.
    """
    if requested == HIGH_WATERMARK or requested >= broker_low_watermark:
        return DeleteRecordsOutcome(broker_low_watermark, broker_low_watermark)
    if tier_earliest is None or tier_earliest >= broker_low_watermark:
        return DeleteRecordsOutcome(broker_low_watermark, None)  # the tier holds nothing below the broker
    if requested > tier_earliest:
        return DeleteRecordsOutcome(requested, requested)
    return DeleteRecordsOutcome(tier_earliest, None)


def expired_segments(segments: Iterable[RemoteLogSegmentMetadata], retention_ms: int, retention_bytes: int,
                     now_ms: int, broker_log_start: int) -> list[RemoteLogSegmentMetadata]:
    """The served segments the tier's retention deletes, oldest first (-1: unlimited).

    As Kafka's `deletableSegments`: from the oldest segment on, stopping at the first one kept, so a newer
    segment with older timestamps is never deleted behind a kept one (no hole in the history). A segment
    holding data the broker still has (ending at or above `broker_log_start`) is always kept: the tier never
    keeps less than the broker. `retention_bytes` counts the tier's bytes.
    """
    ordered = sorted(segments, key=lambda m: m.start_offset)
    total = sum(md.segment_size_in_bytes for md in ordered)
    out = []
    for md in ordered:
        by_time = retention_ms >= 0 and md.max_timestamp_ms < now_ms - retention_ms
        by_size = retention_bytes >= 0 and total > retention_bytes
        if not (by_time or by_size) or md.end_offset >= broker_log_start:
            break
        total -= md.segment_size_in_bytes
        out.append(md)
    return out


def retention_guard(expiring: list[RemoteLogSegmentMetadata], served: list[RemoteLogSegmentMetadata],
                    max_fraction: float) -> str | None:
    """Why one pass must not delete `expiring` (more than `max_fraction` of the partition's tiered bytes at
    once: most likely a mistyped retention), or None. A partition of one or two segments is not guarded: the guard
    is for mistakes of scale, and there any deletion is most of the bytes. `--confirm-retention` overrides it."""
    if len(served) <= 2:
        return None
    return deletion_guard("tier retention", sum(md.segment_size_in_bytes for md in expiring),
                          sum(md.segment_size_in_bytes for md in served), max_fraction)


def tier_retention_guard(expiring: Iterable[RemoteLogSegmentMetadata], tier: Iterable[RemoteLogSegmentMetadata],
                         max_fraction: float) -> str | None:
    """Why one pass must not delete `expiring` (every partition's, small ones included) of the whole tier's
    `tier` segments, or None. A mistyped retention dooms most of every partition at once; a partition of one or
    two segments escapes `retention_guard` but not this. A tier of one or two segments is not guarded (any
    deletion there is most of it)."""
    tier = list(tier)
    if len(tier) <= 2:
        return None
    return deletion_guard("tier retention over the whole tier", sum(md.segment_size_in_bytes for md in expiring),
                          sum(md.segment_size_in_bytes for md in tier), max_fraction)


def deletion_guard(what: str, doomed: int, total: int, max_fraction: float) -> str | None:
    """Why a pass must not delete `doomed` of `total` tiered bytes at once (more than `max_fraction`), or None."""
    if not total or doomed <= max_fraction * total:
        return None
    return (f"{what} would delete {doomed} of {total} tiered bytes ({doomed / total:.0%}) at once, more "
            f"than tier.retention.max.delete.fraction={max_fraction}; nothing deleted (check the value, or run "
            "with --confirm-retention)")


def topic_deletions_due(gone: set[bytes], sightings: dict[bytes, int], now_ms: int, delay_ms: int
                        ) -> tuple[set[bytes], dict[bytes, int]]:
    """Rule 3: which tiered topic ids leave the tier now. `gone`: the ids the cluster answered UNKNOWN_TOPIC_ID for
    in this pass (the only proof a topic was deleted); `sightings`: when each id was first so answered. An id goes
    once it has been gone for `delay_ms`, seen in this pass too; an id not proven gone in this pass loses its
    sighting (the delay starts again). → (ids to delete, the sightings to keep)."""
    kept = {i: sightings.get(i, now_ms) for i in gone}
    return {i for i, first in kept.items() if now_ms - first >= delay_ms}, kept


def segment_range(start: int, end: int, taken_before: int, first_batch: RecordBatch | None,
                  last_batch: RecordBatch | None) -> tuple[int, int]:
    """[first, last] offsets of the segment copied for the planned range [start, end): from `start` (or the base
    of a batch straddling it that this segment takes, or after one the previous range took: `taken_before`, its
    last offset, -1 if none) up to `end` - 1 or its last batch's last offset, whichever is higher. The broker
    answered every offset in between that holds a record; the others a cleaner removed. first > last: the
    previous range's batch covers all of it."""
    first = min(start, first_batch.base_offset) if first_batch is not None else start
    first = max(first, taken_before + 1)
    last = max(end - 1, last_batch.last_offset if last_batch is not None else -1)
    return first, last


def compacted(configs: Mapping[str, str]) -> bool:
    """Whether a topic's configs make the broker compact it (`cleanup.policy` compact or compact,delete)."""
    return "compact" in {p.strip() for p in configs.get("cleanup.policy", "delete").split(",")}


def tombstones_at_risk(since_ms: int, now_ms: int, delete_retention_ms: int) -> bool:
    """Whether a pass copying a compacted partition's records removed by the cleaner may have missed a tombstone:
    the broker removes one only `delete.retention.ms` after it cleaned it, so what was written after `since_ms` is
    safe while that is less than `delete.retention.ms` ago. `since_ms`: the newest timestamp the tier held before
    the pass, or for a partition tiered for the first time its oldest record copied (-1: unknown, not reported).
    The rule it checks: tier a compacted topic more often than its `delete.retention.ms`."""
    return since_ms >= 0 and now_ms - since_ms >= delete_retention_ms


def never_tiered(topic: str, is_internal: bool = False) -> bool:
    """Internal topics are never tiered, nor listed as the tier's unless asked: the broker's own (marked internal:
    `__consumer_offsets`, `__transaction_state`) and every `__*` topic, tierproxy's metadata topic among them."""
    return is_internal or topic.startswith("__")


def topic_setting(overrides: Mapping[str, Mapping[str, int]], topic: str, key: str, default: int) -> int:
    """One of the tier's per-topic settings (`tier.topic.overrides`: retention.ms, retention.bytes,
    segment.bytes): the topic's own value, else the global one — as a Kafka topic config overrides the broker's."""
    return int(overrides.get(topic, {}).get(key, default))


def served_segments(finished: Iterable[RemoteLogSegmentMetadata], log_start: int) -> list[RemoteLogSegmentMetadata]:
    """The segments the tier serves, in offset order: finished ones not wholly below the purged log start."""
    return [md for md in finished if md.end_offset >= log_start]


def tier_start(served: list[RemoteLogSegmentMetadata], log_start: int) -> int | None:
    """The first offset the tier serves: its oldest served segment's start, or the purged log start inside it;
    None when it serves nothing."""
    return max(served[0].start_offset, log_start) if served else None


def tiering_lag(tier_end: int, broker_log_start: int, last_stable: int) -> int:
    """Offsets below the last stable offset that the broker holds and the tier does not yet (-1: nothing tiered)."""
    return max(0, last_stable - max(tier_end + 1, broker_log_start))


def lost_range(first: int, until: int, broker_log_start: int) -> tuple[int, int] | None:
    """The part of [first, until) that is not tiered and that the broker no longer holds (below its log start):
    (first missing, last missing), or None. What the tier job reports as a gap and the admin API shows."""
    last = min(until, broker_log_start) - 1
    return (first, last) if first <= last else None


def cleaning_bound(holes: list[tuple[int, int]], broker_log_start: int | None,
                   last_stable: int | None) -> int | None:
    """Where a tier compaction of a partition stops (None: nowhere in particular): its last stable offset, or the
    first hole between its tier segments that a later pass may still fill (`first_open_hole`), whichever is
    lower. A tombstone removed past such a hole would leave the older value its copy brings back, a deleted key
    served again; a hole wholly below the broker's log start is a gap for good, and the cleaning goes across it."""
    bounds = [b for b in (first_open_hole(holes, broker_log_start), last_stable) if b is not None]
    return min(bounds) if bounds else None


def holes_between(segments: Iterable[RemoteLogSegmentMetadata]) -> list[tuple[int, int]]:
    """[first missing, next start) between served segments (in offset order), oldest first."""
    ordered = sorted(segments, key=lambda m: m.start_offset)
    out: list[tuple[int, int]] = []
    end = -1
    for md in ordered:
        if end >= 0 and md.start_offset > end + 1:
            out.append((end + 1, md.start_offset))
        end = max(end, md.end_offset)
    return out


def resume_offset(offset: int, next_tiered: int | None, broker_log_start: int) -> int:
    """Where a read at `offset`, which the tier does not serve and the broker no longer holds, goes on: the first
    offset above it that either holds — the broker's log start, or the start of the next tiered segment
    (`next_tiered`, None: none above), whichever is lower. Everything in between is a gap."""
    return broker_log_start if next_tiered is None else min(broker_log_start, next_tiered)


def first_open_hole(holes: list[tuple[int, int]], broker_log_start: int | None) -> int | None:
    """The start of the first hole a later tiering pass may still fill: the broker holds some of it (its log start
    below the hole's end), or the broker's log start is not known. None: every hole is a gap for good. Nothing at
    or above it may be taken as complete (the Iceberg ledger stops there)."""
    return next((a for a, b in holes if broker_log_start is None or broker_log_start < b), None)
