"""Where a restored partition begins and what a restore refuses, decided before anything changes."""

from __future__ import annotations

import json
from dataclasses import replace

from tests.support.segments import seg, tp
from tierproxy.jobs.restore.plan import TargetPartition, check_target, choose_facts, plan_topics
from tierproxy.tier.model import SegmentState, uuid_str
from tierproxy.tier.rlmm import ReplayedMetadata, transition
from tierproxy.tier.serde import encode_value, record_key
from tierproxy.tier.snapshot import (
    GROUP,
    LISTING,
    PARTITION,
    GroupOffset,
    PartitionFacts,
    TierSnapshot,
    TopicFacts,
    Unread,
)

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


def _pass(taken: int, partitions: list[PartitionFacts], groups: dict[str, list[GroupOffset]],
          unread: list[Unread]) -> TierSnapshot:
    snap, _ = _snapshot(0, {})
    return replace(snap, taken_ms=taken, run_id=f"r{taken}", partitions=partitions, groups=groups, unread=unread)


def test_facts_a_degraded_last_pass_could_not_read_come_from_the_newest_pass_that_holds_them_whole() -> None:
    g = GroupOffset("orders", 0, 90, 7, None)
    older = _pass(1, [PartitionFacts("orders", 0, 140, 0, 7), PartitionFacts("orders", 1, 50, 0, 3)],
                  {"g": [g], "h": [g], "gone": [g]}, [])
    middle = _pass(2, [PartitionFacts("orders", 1, 55, 0, 3)], {"g": [g], "h": [replace(g, offset=95)], "gone": [g]},
                   [Unread(PARTITION, "orders", 0, "no leader")])
    # the last pass: orders-0's leader unreachable (a leaderless partition is not recorded, never read as 0), one
    # broker's ListGroups failed (g, coordinated there, is not listed), h's OffsetFetch failed
    last = _pass(3, [PartitionFacts("orders", 1, 60, 0, 4)], {},
                 [Unread(PARTITION, "orders", 0, "its leader (node 2) gave no offsets"),
                  Unread(LISTING, "127.0.0.1:9093", -1, "ListGroups: connection refused"),
                  Unread(GROUP, "h", -1, "OffsetFetch error 15")])
    chosen = choose_facts([last, middle, older])
    assert not chosen.missing_for({"orders"}) and chosen.missing_for({"skipped"}), "skipped-0: in no pass"
    facts = {(p.topic, p.partition): (p.high_watermark, p.leader_epoch) for p in chosen.snapshot.partitions}
    assert facts == {("orders", 0): (140, 7), ("orders", 1): (60, 4)}
    assert chosen.snapshot.groups == {"g": [g], "h": [replace(g, offset=95)], "gone": [g]}
    assert any(line.startswith("orders-0 from the pass at 1") for line in chosen.older), chosen.older
    assert "group h from the pass at 2" in chosen.older and "group g from the pass at 2" in chosen.older
    (plan,) = plan_topics(chosen.snapshot, ReplayedMetadata.of(chosen.snapshot.records).cache, "orders")
    assert plan.partitions[0].start == 140, "S never below the end an older pass recorded"
    # a whole listing without a group: it has no offsets left (deleted since): not restored from an older pass
    whole = _pass(4, [PartitionFacts("orders", 0, 150, 0, 7), PartitionFacts("orders", 1, 50, 0, 4)], {}, [])
    chosen = choose_facts([whole, last, middle, older])
    assert chosen.snapshot.groups == {} and not chosen.older and not chosen.missing_for({"orders"})
    assert {p.partition: p.high_watermark for p in chosen.snapshot.partitions} == {0: 150, 1: 60}, \
        "the highest end any pass recorded (orders-1: 60 then, 50 now)"


def test_facts_no_kept_pass_holds_whole_are_missing_named_item_by_item() -> None:
    last = _pass(3, [PartitionFacts("orders", 1, 60, 0, 4)], {"g": [GroupOffset("orders", 1, 5, 4, None)]},
                 [Unread(PARTITION, "orders", 0, "no leader"), Unread(GROUP, "h", -1, "no coordinator"),
                  Unread(LISTING, "127.0.0.1:9093", -1, "ListGroups error 15")])
    chosen = choose_facts([last])
    assert [u.describe() for u in chosen.missing_for({"orders"})] == [
        "partition orders-0 (no leader)", "group h (no coordinator)",
        "the group listing at 127.0.0.1:9093 (ListGroups error 15)"]
    assert chosen.snapshot.groups == {"g": [GroupOffset("orders", 1, 5, 4, None)]}
    assert [(p.partition, p.start) for p in plan_topics(chosen.snapshot, ReplayedMetadata.of(
        chosen.snapshot.records).cache, "orders")[0].partitions] == [(0, 100), (1, 60)]


def test_a_format_1_snapshot_is_read_its_unreadable_groups_an_unread_listing() -> None:
    snap = _pass(1, [PartitionFacts("orders", 0, 100, 0, 7)], {}, [])
    raw = json.loads(snap.encode())
    raw.update(format=1, groups_unreadable="may not DESCRIBE the cluster")
    del raw["unread"]
    old = TierSnapshot.decode(json.dumps(raw).encode())
    assert not old.listing_whole() and old.partition_whole("orders", 0) and not old.partition_whole("orders", 1)
    assert [u.describe() for u in choose_facts([old]).missing_for({"orders"})] == [
        "partition orders-1 (not recorded by any kept pass)",
        "the group listing at the cluster (may not DESCRIBE the cluster)"]
