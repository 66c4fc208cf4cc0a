"""The tier's description of itself: snapshots written whole, the newest that parses wins, mounts continue a lost
cluster's history under the new cluster's topic id."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.support.segments import seg, tp
from tierproxy.tier import snapshot as snapshots
from tierproxy.tier.model import NO_ALIAS, SegmentState, TierPass, TopicMount, uuid_str
from tierproxy.tier.rlmm import ReplayedMetadata, transition
from tierproxy.tier.serde import decode_value, encode_value, record_key
from tierproxy.tier.snapshot import GroupOffset, PartitionFacts, TierSnapshot, TopicFacts
from tierproxy.tier.storage import FileStore


def snap(taken: int, run: str = "r") -> TierSnapshot:
    return TierSnapshot("A-cluster", taken, run, "__meta", "bWV0YQ", {
        "orders": TopicFacts("orders", "b3JkZXJz", "b3JkZXJz", 2, 3, {"cleanup.policy": "delete"})},
        [PartitionFacts("orders", 0, 10, 0, 5)],
        {"g": [GroupOffset("orders", 0, 7, 5, "m")]}, None, [(b"k", encode_value(TierPass("x", True, 1)))])


def test_a_snapshot_round_trips_and_a_cut_one_is_refused() -> None:
    s = snap(1)
    assert TierSnapshot.decode(s.encode()) == s
    for bad in (s.encode()[:-10], b"{}", b'{"format": 99}', b"[1]"):
        with pytest.raises(ValueError):
            TierSnapshot.decode(bad)


def test_the_newest_whole_snapshot_wins_and_five_are_kept(tmp_path: Path) -> None:
    async def go() -> None:
        store = FileStore(tmp_path)
        for t in range(1, 8):
            await snapshots.write(store, "p", snap(t, f"r{t}"))
        names = await store.list("p/snapshots/")
        assert [n.rsplit("-", 1)[1] for n in names] == [f"r{t}.json" for t in range(3, 8)]
        newest = await snapshots.newest(store, "p")
        assert newest is not None and newest.run_id == "r7"
        await store.put(names[-1], b'{"format": 1, "cluster_id": "cut')  # a newest one cut short: skipped
        newest = await snapshots.newest(store, "p")
        assert newest is not None and newest.run_id == "r6"
        assert await snapshots.newest(FileStore(tmp_path / "empty"), "") is None

    asyncio.run(go())


def test_a_mount_record_round_trips_under_its_own_key() -> None:
    origin = b"\x01" * 16
    m = TopicMount("orders", origin, b"\x02" * 16, "A", "B", 5)
    assert decode_value(encode_value(m)) == m
    assert record_key(m) == f"tierproxy:mount:{uuid_str(origin)}".encode()
    assert encode_value(m)[:2] == b"\x42\x01"  # tierproxy's api key 66, version 1


def test_a_mount_makes_the_new_id_find_the_old_history() -> None:
    old, new = tp("orders", 0, b"\x01" * 16), b"\x02" * 16
    md = seg(old, 0, 99)
    up = transition(md, SegmentState.COPY_SEGMENT_FINISHED)
    kept = TopicMount("audit", b"\x03" * 16, NO_ALIAS, "A", "B", 5)
    records = [(b"k1", encode_value(md)), (b"k1", encode_value(md.with_update(up))),
               (record_key(kept), encode_value(kept)),
               (b"tierproxy:tierPass:requested", encode_value(TierPass("x", True, 1)))]
    view = ReplayedMetadata.of(records)
    assert view.cache.get(new, 0) is None, "no mount yet"
    mount = TopicMount("orders", old.topic_id, new, "A", "B", 6)
    view.apply_record(record_key(mount), encode_value(mount))
    pc = view.cache.get(new, 0)
    assert pc is not None and pc.tp.topic_id == old.topic_id and pc.latest_tiered_offset() == 99
    assert view.cache.origin(new) == old.topic_id and view.cache.inherited(old.topic_id)
    assert view.cache.inherited(kept.origin_id) and not kept.mounted
    live = dict(view.live_records())
    assert b"tierproxy:tierPass:requested" not in live, "a pass request is the old cluster's, not history"
    assert record_key(mount) in live and record_key(kept) in live
    again = ReplayedMetadata.of(view.live_records())
    assert again.cache.get(new, 0) is not None and again.cache.mounts == view.cache.mounts

