"""The KIP-405 state machine and the cache's segment queries."""

from __future__ import annotations

import pytest

from tests.support.segments import seg, tp
from tierproxy.tier.cache import MetadataCache
from tierproxy.tier.model import (
    IllegalStateTransition,
    PartitionDeleteState,
    RemoteLogStartOffset,
    RemotePartitionDeleteMetadata,
    SegmentState,
)
from tierproxy.tier.rlmm import transition

S = SegmentState


def _finish(cache: MetadataCache, md):  # type: ignore[no-untyped-def]
    cache.apply(md)
    cache.apply(transition(md, S.COPY_SEGMENT_FINISHED))
    return md


def test_legal_lifecycle() -> None:
    cache, t = MetadataCache(), tp()
    md = seg(t, 0, 99)
    cache.apply(md)
    assert cache.get(t.topic_id, 0).segment_for(5, 0) is None  # STARTED segments are not served
    for state in (S.COPY_SEGMENT_FINISHED, S.DELETE_SEGMENT_STARTED, S.DELETE_SEGMENT_FINISHED):
        cache.apply(transition(md, state))
    assert cache.get(t.topic_id, 0).all_segments() == []


@pytest.mark.parametrize(("path", "bad"), [
    ([], S.COPY_SEGMENT_FINISHED),
    ([S.COPY_SEGMENT_FINISHED], S.COPY_SEGMENT_STARTED),
    ([S.COPY_SEGMENT_FINISHED], S.DELETE_SEGMENT_FINISHED),
    ([S.COPY_SEGMENT_FINISHED], S.COPY_SEGMENT_FINISHED),
    ([S.DELETE_SEGMENT_STARTED, S.DELETE_SEGMENT_FINISHED], S.COPY_SEGMENT_FINISHED),
])
def test_illegal_transitions_rejected_with_a_clear_error(path: list[SegmentState], bad: SegmentState) -> None:
    cache, t = MetadataCache(), tp()
    md = seg(t, 0, 9)
    if path or bad != S.COPY_SEGMENT_FINISHED:
        cache.apply(md)
    for state in path:
        cache.apply(transition(md, state))
    with pytest.raises(IllegalStateTransition, match=r"->|first event"):
        cache.apply(transition(md, bad))


def test_partition_delete_state_machine() -> None:
    cache, t = MetadataCache(), tp()
    P = PartitionDeleteState

    def ev(state: PartitionDeleteState) -> RemotePartitionDeleteMetadata:
        return RemotePartitionDeleteMetadata(t, state, 1, 1)

    with pytest.raises(IllegalStateTransition):
        cache.apply(ev(P.DELETE_PARTITION_STARTED))
    for state in (P.DELETE_PARTITION_MARKED, P.DELETE_PARTITION_STARTED, P.DELETE_PARTITION_FINISHED):
        cache.apply(ev(state))
    with pytest.raises(IllegalStateTransition):
        cache.apply(ev(P.DELETE_PARTITION_MARKED))


def test_queries_over_epochs() -> None:
    cache, t = MetadataCache(), tp()
    _finish(cache, seg(t, 0, 99, {0: 0}))
    _finish(cache, seg(t, 100, 199, {0: 100, 1: 150}))
    _finish(cache, seg(t, 200, 299, {2: 200}))
    pc = cache.get(t.topic_id, 0)
    assert pc is not None
    assert pc.earliest_offset() == 0 and pc.latest_tiered_offset() == 299
    assert pc.segment_for(120, 0).start_offset == 100
    assert pc.segment_for(160, 0) is None and pc.segment_for(160, 1).start_offset == 100
    assert pc.segment_for_offset(250).start_offset == 200
    assert pc.highest_offset_for_epoch(0) == 149 and pc.highest_offset_for_epoch(1) == 199
    assert [(e, lo, hi) for e, lo, hi in pc.lineage()] == [(0, 0, 149), (1, 150, 199), (2, 200, 299)]
    assert pc.end_offset_for_epoch(1) == (1, 200) and pc.end_offset_for_epoch(5) == (2, 300)
    assert [m.start_offset for m in pc.segments_for_epoch(0)] == [0, 100]


def test_highest_leader_epoch_wins_whatever_the_order() -> None:
    for order in ((3, 4), (4, 3)):
        cache, t = MetadataCache(), tp()
        a = seg(t, 0, 99, {3: 0}, broker_epoch=order[0])
        b = seg(t, 0, 99, {3: 0}, broker_epoch=order[1])
        _finish(cache, a)
        _finish(cache, b)
        pc = cache.get(t.topic_id, 0)
        winner = a if a.broker_leader_epoch == 4 else b
        assert pc.segment_for(50, 3).segment_id == winner.segment_id
        loser = b if winner is a else a
        assert loser.segment_id.id in pc.unreferenced


def test_a_purged_log_start_hides_what_is_below_it_and_only_moves_up() -> None:
    cache, t = MetadataCache(), tp()
    for start in (0, 100, 200):
        _finish(cache, seg(t, start, start + 99, {0: start}))
    pc = cache.get(t.topic_id, 0)
    assert pc is not None
    cache.apply(RemoteLogStartOffset(t, 150, 1))
    assert pc.earliest_offset() == 150  # inside the straddling segment: from the purge point, not its start
    assert pc.segment_for_offset(149) is None and pc.segment_for(99, 0) is None
    assert pc.segment_for_offset(150).start_offset == 100  # the batch holding 150 is still served
    assert [m.start_offset for m in pc.purged()] == [0]
    cache.apply(RemoteLogStartOffset(t, 120, 2))  # an older record (replayed out of order) never lowers it
    assert pc.log_start_offset == 150
    cache.apply(RemoteLogStartOffset(t, 300, 3))  # everything purged: the tier answers nothing
    assert pc.earliest_offset() is None and pc.segment_for_offset(250) is None
    assert [m.start_offset for m in pc.purged()] == [0, 100, 200]


def test_a_requested_pass_is_pending_until_taken_withdrawn_or_expired() -> None:
    """Issue 64: a request nobody took must not stay pending for ever (it made every later request a 409)."""
    from tierproxy.tier.model import PassStage, TierPass

    cache = MetadataCache()
    cache.apply(TierPass("a", True, 1_000, expires_ms=61_000))
    assert cache.pass_pending(60_999) == cache.pass_requested
    assert cache.pass_pending(61_000) is None  # expired: no job takes it, a new request is not refused
    cache.apply(TierPass("b", True, 70_000))  # a request of an older version: no expiry
    assert cache.pass_pending(10**12) is not None
    cache.apply(TierPass("b", False, 70_500, stage=PassStage.WITHDRAWN))
    assert cache.pass_pending(70_600) is None
    cache.apply(TierPass("c", True, 80_000, expires_ms=140_000))
    cache.apply(TierPass("c", False, 80_500, stage=PassStage.TAKEN))
    assert cache.pass_pending(80_600) is None  # taken: a later request waits for the next pass, not behind it


def test_find_by_name_takes_the_newest_id_not_deleted() -> None:
    """A name reused after a delete: `find` (the by-name look-up every Fetch and ListOffsets by name makes, indexed
    since a fetch names 10,000 partitions) gives the newest id the tier still holds, and the older once the newer is
    deleted; none once both are."""
    cache = MetadataCache()
    old, new = tp("orders", 1), tp("orders", 1)
    for t in (old, new, tp("orders", 2), tp("other", 1)):
        cache.apply(seg(t, 0, 9))
    assert cache.find("orders", 1) is cache.get(new.topic_id, 1)
    assert cache.find("orders", 3) is None and cache.find("absent", 1) is None
    for state in (PartitionDeleteState.DELETE_PARTITION_MARKED, PartitionDeleteState.DELETE_PARTITION_STARTED):
        cache.apply(RemotePartitionDeleteMetadata(new, state, 1, 0))
    assert cache.find("orders", 1) is cache.get(old.topic_id, 1)
    cache.apply(RemotePartitionDeleteMetadata(new, PartitionDeleteState.DELETE_PARTITION_FINISHED, 2, 0))
    for state in PartitionDeleteState:
        cache.apply(RemotePartitionDeleteMetadata(old, state, 3, 0))
    assert cache.find("orders", 1) is None and cache.find("orders", 2) is not None
    assert ("orders", 1) not in cache._by_name
