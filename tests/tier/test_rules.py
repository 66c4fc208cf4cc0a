"""The log-start and tier-retention rules (`tier.rules`), whole tables."""

from __future__ import annotations

import pytest

from tests.support.segments import seg, tp
from tierproxy.tier.model import RemoteLogSegmentMetadata
from tierproxy.tier.rules import (
    DeleteRecordsOutcome,
    cleaning_bound,
    delete_records_outcome,
    expired_segments,
    first_open_hole,
    holes_between,
    lost_range,
    resume_offset,
    retention_guard,
    served_segments,
    tier_start,
    tiering_lag,
    topic_deletions_due,
    topic_setting,
)

# requested, the broker's low watermark, the tier's first served offset → answer, log start to record
DELETE_RECORDS = [
    # the broker keeps from 5, the tier holds 0..4 (Kafka's DeleteSegmentsDueToLogStartOffsetBreachTest)
    (3, 5, 0, DeleteRecordsOutcome(3, 3)),
    (0, 5, 0, DeleteRecordsOutcome(0, None)),  # at the current start: nothing moves
    (5, 5, 0, DeleteRecordsOutcome(5, 5)),  # at the broker's start: applied there, the tier stops below it
    (7, 7, 0, DeleteRecordsOutcome(7, 7)),  # applied by the broker above its start
    (-1, 20, 0, DeleteRecordsOutcome(20, 20)),  # -1: the high watermark, everything, tier included
    (2, 5, 3, DeleteRecordsOutcome(3, None)),  # below an earlier purge: the current start stands
    (4, 5, 3, DeleteRecordsOutcome(4, 4)),
    (3, 5, None, DeleteRecordsOutcome(5, None)),  # the tier holds nothing: the broker's answer
    (3, 5, 5, DeleteRecordsOutcome(5, None)),  # the tier holds nothing below the broker
    (3, 5, 8, DeleteRecordsOutcome(5, None)),
]


@pytest.mark.parametrize(("requested", "broker", "tier_earliest", "expected"), DELETE_RECORDS)
def test_delete_records_outcome(requested: int, broker: int, tier_earliest: int | None,
                                expected: DeleteRecordsOutcome) -> None:
    assert delete_records_outcome(requested, broker, tier_earliest) == expected


def _segments() -> list[RemoteLogSegmentMetadata]:
    t = tp()
    # 4 segments of 100 offsets (10,000 bytes each), max timestamps 1,099 / 1,199 / 1,299 / 1,399
    return [seg(t, i * 100, i * 100 + 99, ts=1000) for i in range(4)]


# retention.ms, retention.bytes, now, the broker's log start → how many of the oldest segments expire
EXPIRY = [
    (-1, -1, 10_000, 400, 0),  # keep forever
    (0, -1, 10_000, 400, 4),  # everything is older than 0 ms
    (0, -1, 10_000, 250, 2),  # never what the broker still has
    (0, -1, 10_000, 0, 0),
    (8_750, -1, 10_000, 400, 2),  # older than 1,250 ms: the first two
    (-1, 20_000, 10_000, 400, 2),  # 40,000 bytes, 20,000 kept
    (-1, 19_999, 10_000, 400, 3),
    (-1, 0, 10_000, 400, 4),
    (8_750, 35_000, 10_000, 400, 2),  # the stricter of the two
]


@pytest.mark.parametrize(("ms", "max_bytes", "now", "broker_start", "n"), EXPIRY)
def test_expired_segments(ms: int, max_bytes: int, now: int, broker_start: int, n: int) -> None:
    segs = _segments()
    assert expired_segments(reversed(segs), ms, max_bytes, now, broker_start) == segs[:n]


def test_expiry_stops_at_the_first_segment_kept() -> None:
    """A newer segment with older timestamps is not deleted behind a kept one (no hole)."""
    t = tp()
    segs = [seg(t, 0, 99, ts=5000), seg(t, 100, 199, ts=1000)]
    assert expired_segments(segs, 2000, -1, 5000, 1000) == []


@pytest.mark.parametrize(("doomed", "fraction", "refused"), [
    (0, 0.5, False), (2, 0.5, False), (3, 0.5, True), (4, 0.5, True), (4, 1.0, False), (1, 0.2, True),
])
def test_retention_guard(doomed: int, fraction: float, refused: bool) -> None:
    segs = _segments()
    why = retention_guard(segs[:doomed], segs, fraction)
    assert (why is not None) == refused
    if why is not None:
        assert "tier.retention.max.delete.fraction" in why and f"{doomed * 10_000} of 40000" in why


@pytest.mark.parametrize(("served", "doomed", "refused"), [(1, 1, False), (2, 2, False), (2, 1, False), (3, 3, True)])
def test_the_retention_guard_spares_a_partition_of_one_or_two_segments(served: int, doomed: int,
                                                                      refused: bool) -> None:
    """The guard is for mistakes of scale: on a partition of one or two segments any deletion is most of its
    bytes, and the retention asked for applies (before: every pass refused it, exit 5, forever)."""
    segs = _segments()[:served]
    assert (retention_guard(segs[:doomed], segs, 0.5) is not None) == refused


# holes, the broker's log start → the first hole a later pass may still fill
OPEN_HOLES = [
    ([], 50, None),
    ([(10, 20)], 5, 10),  # the broker holds the whole hole
    ([(10, 20)], 15, 10),  # it holds [15, 20): the next pass copies that part
    ([(10, 20)], 20, None),  # all of it gone from the broker: a gap for good
    ([(10, 20), (30, 40)], 25, 30),
    ([(10, 20)], None, 10),  # the broker's log start unknown: assume it may be filled
]


@pytest.mark.parametrize(("holes", "broker_start", "expected"), OPEN_HOLES)
def test_first_open_hole(holes: list[tuple[int, int]], broker_start: int | None, expected: int | None) -> None:
    assert first_open_hole(holes, broker_start) == expected


@pytest.mark.parametrize(("offset", "next_tiered", "broker_start", "expected"), [
    (10, 20, 15, 15),  # inside a hole the broker holds from 15: from the broker
    (10, 20, 25, 20),  # the broker starts above the hole: from the next tiered segment
    (10, None, 25, 25),  # past the tier's end: from the broker's log start
])
def test_resume_offset(offset: int, next_tiered: int | None, broker_start: int, expected: int) -> None:
    assert resume_offset(offset, next_tiered, broker_start) == expected


def test_holes_between_and_topic_deletions_due() -> None:
    t = tp()
    assert holes_between([seg(t, 50, 59), seg(t, 0, 9), seg(t, 10, 19), seg(t, 30, 39)]) == [(20, 30), (40, 50)]
    a, b = b"a" * 16, b"b" * 16
    due, seen = topic_deletions_due({a, b}, {a: 1_000}, 10_000, 5_000)
    assert (due, seen) == ({a}, {a: 1_000, b: 10_000})  # a gone since 1 s: due; b first seen now
    due, seen = topic_deletions_due({b}, seen, 20_000, 5_000)
    assert (due, seen) == ({b}, {b: 10_000})  # a no longer proven gone: its sighting dropped


@pytest.mark.parametrize(("first", "until", "broker_start", "expected"), [
    (100, 200, 150, (100, 149)),  # the broker deleted [100, 150) before it was tiered
    (100, 200, 250, (100, 199)),  # a hole the broker no longer holds any of
    (100, 200, 100, None),  # the broker still holds all of it
    (100, 100, 150, None),  # nothing asked
])
def test_lost_range(first: int, until: int, broker_start: int, expected: tuple[int, int] | None) -> None:
    assert lost_range(first, until, broker_start) == expected


@pytest.mark.parametrize(("tier_end", "broker_start", "lso", "lag"), [
    (-1, 0, 500, 500), (199, 0, 500, 300), (199, 300, 500, 200), (499, 0, 500, 0), (600, 0, 500, 0),
])
def test_tiering_lag(tier_end: int, broker_start: int, lso: int, lag: int) -> None:
    assert tiering_lag(tier_end, broker_start, lso) == lag


def test_served_segments_and_tier_start() -> None:
    t = tp()
    segs = [seg(t, 0, 99), seg(t, 100, 199), seg(t, 200, 299)]
    assert served_segments(segs, 150) == segs[1:] and tier_start(served_segments(segs, 150), 150) == 150
    assert tier_start(served_segments(segs, 0), 0) == 0 and tier_start(served_segments(segs, 300), 300) is None


def test_a_topic_setting_is_the_topics_override_else_the_global_value() -> None:
    overrides = {"audit": {"retention.ms": 86_400_000, "segment.bytes": 1 << 20}}
    assert topic_setting(overrides, "audit", "retention.ms", -1) == 86_400_000
    assert topic_setting(overrides, "audit", "retention.bytes", -1) == -1  # not overridden: the global value
    assert topic_setting(overrides, "orders", "segment.bytes", 128 << 20) == 128 << 20


def test_cleaning_bound_stops_at_the_first_hole_the_broker_still_holds() -> None:
    holes = [(100, 150), (300, 320)]  # [first missing, next start)
    assert cleaning_bound(holes, 0, 1000) == 100  # the broker holds both: the first stops it
    assert cleaning_bound(holes, 150, 1000) == 300  # the first is a gap for good (wholly below the log start)
    assert cleaning_bound(holes, 149, 1000) == 100  # the broker still holds offset 149 of it
    assert cleaning_bound(holes, None, 1000) == 100  # the log start unknown: every hole counts
    assert cleaning_bound(holes, 0, 50) == 50  # the last stable offset below it
    assert cleaning_bound([], 0, None) is None and cleaning_bound([], None, 7) == 7
    assert cleaning_bound(holes, 320, None) is None
