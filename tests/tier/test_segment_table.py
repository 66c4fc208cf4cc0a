"""A view keeps a partition's segments as the records they came in (`tier.segment_table`): no second copy of a
record, the same answers as segments kept whole, and made segments held within a budget across partitions."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest

from tests.support.segments import seg, tp
from tierproxy.tier.cache import PartitionCache
from tierproxy.tier.model import RemoteLogSegmentMetadata, SegmentState, TopicIdPartition
from tierproxy.tier.rlmm import ReplayedMetadata
from tierproxy.tier.segment_record import peek_segment_record
from tierproxy.tier.segment_table import MATERIALIZED
from tierproxy.tier.serde import encode_value, record_key


def finished(md: RemoteLogSegmentMetadata, **kw: object) -> RemoteLogSegmentMetadata:
    return dataclasses.replace(md, state=SegmentState.COPY_SEGMENT_FINISHED, **kw)  # type: ignore[arg-type]


def tier(partitions: list[TopicIdPartition], per: int) -> list[RemoteLogSegmentMetadata]:
    return [finished(seg(t, i * 100, i * 100 + 99, ts=5_000 + i), custom_metadata=b"m" if i % 3 else None)
            for t in partitions for i in range(per)]


@pytest.fixture
def budget() -> Iterator[None]:
    before = MATERIALIZED.budget
    MATERIALIZED.budget = 25
    yield
    MATERIALIZED.budget = before


def test_a_segment_is_kept_as_its_record_and_read_the_same() -> None:
    mds = tier([tp("orders", 0), tp("orders", 1)], 10)
    view = ReplayedMetadata.of([(record_key(md), encode_value(md)) for md in mds])
    for md in mds:
        pc = view.partition(md.tp)
        assert pc is not None
        assert pc.segments._stored[md.segment_id.id] is view.values[record_key(md)]  # one object, not a copy
        assert pc.segments[md.segment_id.id] == md
    pc = view.partition(mds[0].tp)
    assert pc is not None and list(pc.finished()) == mds[:10]
    assert pc.summary() == (10, sum(m.segment_size_in_bytes for m in mds[:10]), max(m.event_timestamp_ms
                                                                                   for m in mds[:10]))
    assert pc.earliest_offset() == 0 and pc.latest_tiered_offset() == 999 and pc.holes() == []


def test_made_segments_are_held_within_the_budget_and_made_again_when_read(budget: None) -> None:
    parts = [tp("orders", p) for p in range(5)]
    mds = tier(parts, 10)
    view = ReplayedMetadata.of([(record_key(md), encode_value(md)) for md in mds])
    caches = [view.partition(t) for t in parts]
    assert all(isinstance(pc, PartitionCache) for pc in caches)
    for pc in caches:
        assert pc is not None and len(list(pc.finished())) == 10
    made = [pc for pc in caches if pc is not None and pc._served is not None]
    assert len(made) == 2 and MATERIALIZED.held <= 25 + 10, "the two read last are kept, the rest dropped"
    first = caches[0]
    assert first is not None and first._served is None
    assert list(first.finished()) == mds[:10] and first._served is not None  # made again, the same
    assert first.segment_for_offset(555) == mds[5]


def test_a_change_drops_what_was_made_and_a_finished_record_of_an_unseen_segment_is_a_change() -> None:
    """Before: a FINISHED record of a segment the view had not seen (what compaction leaves) did not reset the
    served list a read had made, so that segment was not served until the next change."""
    t = tp("orders", 0)
    mds = tier([t], 3)
    view = ReplayedMetadata.of([(record_key(md), encode_value(md)) for md in mds])
    pc = view.partition(t)
    assert pc is not None and len(list(pc.finished())) == 3
    held = MATERIALIZED.held
    more = finished(seg(t, 300, 399))
    view.apply_record(record_key(more), encode_value(more))
    assert MATERIALIZED.held == held - 3 and pc._served is None
    assert list(pc.finished())[-1] == more and pc.summary()[0] == 4


def test_peek_reads_what_the_segment_says() -> None:
    for md in [*tier([tp("a-topic-with-a-longer-name", 3)], 4), finished(seg(tp(), 0, 9, {0: 0, 3: 4, 7: 8}))]:
        assert peek_segment_record(encode_value(md)) == (md.start_offset, md.end_offset, md.event_timestamp_ms,
                                                         md.segment_size_in_bytes)
    assert peek_segment_record(encode_value(finished(seg(tp("x" * 200), 0, 9)))) is None  # a name past one byte
