"""The key map is bounded: a cleaning whose dirty keys outnumber the map cleans what the map covered and leaves
the rest dirty; the next cleanings go on from there and finish with the records one cleaning with a big map
keeps."""

from __future__ import annotations

import pytest

from tests.support.compaction import Batch, History, Tier, latest_values
from tierproxy.tier.compaction import BYTES_PER_ENTRY, CleanerConfig, MapTooSmall, OffsetMap

KEYS = [b"key-%03d" % i for i in range(150)]
NOW = 10_000


def _tier() -> Tier:
    """150 keys written three times over (every 7th a tombstone the last time), idempotent and plain producers,
    a committed and an aborted transaction; 30 raw segments."""
    tier, h = Tier(CleanerConfig(delete_retention_ms=1_000, min_cleanable_dirty_ratio=0.0)), History(KEYS)
    batches = []
    for round_ in range(3):
        for i in range(0, len(KEYS), 3):
            ops = [(k, not (round_ == 2 and k % 7 == 0)) for k in range(i, min(i + 3, len(KEYS)))]
            batches.append(h.data(100 if i % 2 else -1, ops, NOW - 5_000 + round_))
        batches += h.chunk([("txn", 200, 3, round_ != 1)], NOW - 5_000 + round_)
    for i in range(0, len(batches), 6):
        tier.append(batches[i:i + 6])
    return tier


def _records(batches: list[Batch]) -> list[tuple[int, bytes | None, bytes | None]]:
    return [r for b in batches for r in b.records]


def test_a_small_map_cleans_what_it_covered_and_the_next_cleaning_finishes() -> None:
    big = _tier()
    assert big.clean(NOW) is not None
    assert all(s.cleaned for s, _ in big.segments)

    small = _tier()
    map_bytes = BYTES_PER_ENTRY * 112  # 100 keys: fewer than the 150 of the dirty segments
    assert OffsetMap(map_bytes).max_entries == 100
    first = small.clean(NOW, map_bytes=map_bytes)
    assert first
    # the map filled inside a segment: it is written in two, what the map covered and the rest (still dirty)
    assert not first[-1].cleaned and not first[-1].replaces and first[-2].cleaned
    assert first[-1].start_offset == first[-2].end_offset + 1
    ends = {s.end_offset for s, _ in small.segments if s.cleaned}
    assert max(ends) < small.segments[-1][0].end_offset  # a dirty part is left
    covered = max(ends)
    mapped_keys = [k for off, k, _ in _records(small.batches()) if off <= covered]
    assert len(mapped_keys) == len(set(mapped_keys))  # what the map covered is deduplicated
    assert len(mapped_keys) < len(KEYS)

    # each pass maps up to 100 more of the 450 dirty writes: the cleaned point moves on, and the cleaning ends
    passes = 1
    while not all(s.cleaned for s, _ in small.segments):
        assert passes < 6 and small.clean(NOW, map_bytes=map_bytes) is not None
        now_covered = max(s.end_offset for s, _ in small.segments if s.cleaned)
        assert now_covered > covered
        covered, passes = now_covered, passes + 1
    assert passes > 2
    assert _records(small.batches()) == _records(big.batches())
    assert latest_values(small.batches()) == latest_values(big.batches())
    assert [b.base for b in small.batches() if b.control is not None] == \
        [b.base for b in big.batches() if b.control is not None]


def test_a_map_smaller_than_one_batch_says_so() -> None:
    tier = _tier()
    with pytest.raises(MapTooSmall, match="raise its bytes"):
        tier.clean(NOW, map_bytes=BYTES_PER_ENTRY * 3)
