"""Where a restored partition begins and what a restore refuses, decided before anything changes."""

from __future__ import annotations

from tests.support.segments import seg, tp
from tierproxy.jobs.restore.plan import TargetPartition, check_target, plan_topics
from tierproxy.tier.model import SegmentState, uuid_str
from tierproxy.tier.rlmm import ReplayedMetadata, transition
from tierproxy.tier.serde import encode_value, record_key
from tierproxy.tier.snapshot import GroupOffset, PartitionFacts, TierSnapshot, TopicFacts

TID = b"\x07" * 16


def _snapshot(hw: int, groups: dict[str, list[GroupOffset]]) -> tuple[TierSnapshot, ReplayedMetadata]:
    t = tp("orders", 0, TID)
    md = seg(t, 0, 99, {2: 0, 6: 50})
    done = md.with_update(transition(md, SegmentState.COPY_SEGMENT_FINISHED))
    records = [(record_key(done), encode_value(done))]
    facts = TopicFacts("orders", uuid_str(TID), uuid_str(TID), 2, 3, {})
    snap = TierSnapshot("A", 1, "r", None, None, {"orders": facts, "skipped": TopicFacts("skipped", "AAAA", "AAAA",
                                                                                         1, 1, {})},
                        [PartitionFacts("orders", 0, hw, 0, 7), PartitionFacts("orders", 1, 0, 0, 3)], groups, None,
                        records)
    return snap, ReplayedMetadata.of(records)


def test_s_is_the_highest_of_the_tier_end_the_recorded_end_and_the_groups() -> None:
    snap, view = _snapshot(100, {})
    (plan,) = plan_topics(snap, view.cache, "orders")
    p0, p1 = plan.partitions
    assert (p0.tier_end, p0.start, p0.lost, p0.min_epoch) == (100, 100, None, 7)
    assert (p1.tier_end, p1.start, p1.lost) == (0, 0, None)
    snap, view = _snapshot(140, {"g": [GroupOffset("orders", 0, 170, 9, None)], "h": [GroupOffset("orders", 1, 5,
                                                                                                    -1, "")]})
    p0, p1 = plan_topics(snap, view.cache, "orders")[0].partitions
    assert (p0.start, p0.lost, p0.min_epoch) == (170, (100, 170), 9), "a group past the end: never reused"
    assert (p1.start, p1.lost) == (5, (0, 5))


def test_a_target_topic_that_holds_records_or_another_shape_is_refused() -> None:
    snap, view = _snapshot(100, {})
    (plan,) = plan_topics(snap, view.cache, "orders")
    empty = {0: TargetPartition(0, 0), 1: TargetPartition(0, 0)}
    assert check_target(plan, None, False) is None
    assert check_target(plan, empty, False) is None
    assert "with 1 partitions, the tier's has 2" in (check_target(plan, {0: TargetPartition(0, 0)}, False) or "")
    assert "holds records" in (check_target(plan, {0: TargetPartition(0, 3), 1: TargetPartition(0, 0)}, False) or "")
    half = {0: TargetPartition(50, 60), 1: TargetPartition(0, 0)}
    assert check_target(plan, half, True) is None, "this restore's own fill, resumed"
    past = {0: TargetPartition(100, 101), 1: TargetPartition(0, 0)}
    assert "past where the restored history begins" in (check_target(plan, past, True) or "")
