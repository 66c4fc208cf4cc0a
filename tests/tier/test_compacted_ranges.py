"""The rules a compacted log's segments follow in the tier (issue 66), on batches made here: a segment's range is
the range planned (`rules.segment_range`), its indexes count from its base offset below its first batch, a range
the cleaner emptied is a segment of no batches, and when a pass reports tombstones at risk."""

from __future__ import annotations

from protocol.records import Record, build_batch, iter_batches
from tierproxy.tier.indexes import (
    SegmentBuilder,
    decode_leader_epochs,
    decode_producer_snapshot,
    empty_segment,
    lookup_position,
    lookup_time,
)
from tierproxy.tier.rules import segment_range, tombstones_at_risk


def _batch(base: int, offsets: list[int], epoch: int = 3) -> bytes:
    """A batch as the cleaner leaves one: its base offset kept, records only at `offsets`."""
    return build_batch([Record(o, 1000 + o, f"k{o}".encode(), b"v" * 3000) for o in offsets], base_offset=base,
                       partition_leader_epoch=epoch)


def test_a_segment_covers_its_planned_range_whatever_its_batches_hold() -> None:
    b = [next(iter_batches(_batch(base, [base + 2]))) for base in (100, 140)]
    assert segment_range(90, 200, -1, b[0], b[-1]) == (90, 199)  # gaps at both ends are the segment's
    assert segment_range(101, 200, -1, b[0], b[-1]) == (100, 199)  # the first range takes a batch straddling it
    assert segment_range(101, 200, 130, None, None) == (131, 199)  # after a batch the previous range took
    assert segment_range(101, 120, 130, None, None)[0] > 119  # all of it taken before: nothing to cover
    assert segment_range(90, 120, -1, None, None) == (90, 119)  # every record removed


def test_indexes_count_from_a_base_offset_below_the_first_batch() -> None:
    raw = [_batch(base, [base + 5, base + 9]) for base in range(50, 250, 20)]
    builder = SegmentBuilder(base_offset=10, index_interval_bytes=1)
    for r in raw:
        builder.add(next(iter_batches(r)))
    files = builder.finish(end_offset=299)
    assert (files.start_offset, files.end_offset) == (10, 299)
    assert files.leader_epochs == {3: 10} and decode_leader_epochs(files.leader_epoch_checkpoint) == {3: 10}
    log = files.log
    for target in (55, 71, 130, 239):  # each found from the index's entries, relative to 10
        batches = list(iter_batches(log[lookup_position(files.offset_index, 10, target):]))
        assert batches[0].base_offset <= target
        assert next(b for b in batches if b.last_offset >= target).base_offset == (target - 50) // 20 * 20 + 50
    assert lookup_time(files.time_index, 10, 1000 + 135) <= 135


def test_a_range_the_cleaner_emptied_is_a_segment_of_no_batches_that_keeps_open_aborts_open() -> None:
    files = empty_segment(300, 399, 4, aborted=[(7, 250), (8, 450)])
    assert (files.start_offset, files.end_offset, files.log_size, files.leader_epochs) == (300, 399, 0, {4: 300})
    snapshot = decode_producer_snapshot(files.producer_snapshot)
    assert {pid: e.current_txn_first_offset for pid, e in snapshot.items()} == {7: 250}  # 8 began after it


def test_tombstones_are_at_risk_once_delete_retention_passed_since_the_tier_s_newest_record() -> None:
    day = 86_400_000
    assert not tombstones_at_risk(10_000, 10_000 + day - 1, day)
    assert tombstones_at_risk(10_000, 10_000 + day, day)
    assert not tombstones_at_risk(-1, 5 * day, day)  # no timestamp to go by: not reported
