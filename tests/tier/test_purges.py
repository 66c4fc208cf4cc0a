"""`tier.purges`: a purge recorded in the tier is replayed by a restore above what its snapshot holds, and only then."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.support.segments import seg, tp
from tierproxy.tier.model import RemoteLogStartOffset, SegmentState
from tierproxy.tier.purges import record_purge, recorded_purges, with_purges
from tierproxy.tier.rlmm import ReplayedMetadata, transition
from tierproxy.tier.serde import encode_value, record_key
from tierproxy.tier.snapshot import TierSnapshot
from tierproxy.tier.storage import FileStore


def test_purges_after_the_snapshot_are_replayed_and_older_ones_change_nothing(tmp_path: Path) -> None:
    orders = tp("orders", 0, b"\x01" * 16)
    md = seg(orders, 0, 999)
    done = md.with_update(transition(md, SegmentState.COPY_SEGMENT_FINISHED))
    at_pass = RemoteLogStartOffset(orders, 100, 1)
    snap = TierSnapshot("A", 1, "r", None, None, records=[
        (b"k", encode_value(md)), (b"k", encode_value(done)), (record_key(at_pass), encode_value(at_pass))])

    async def go() -> None:
        store = FileStore(tmp_path)
        assert await with_purges(store, "p", snap) is snap, "no purge record: the snapshot as it is"
        await record_purge(store, "p", RemoteLogStartOffset(orders, 50, 2))  # below the snapshot's: nothing
        await record_purge(store, "p", RemoteLogStartOffset(orders, 700, 4))
        await record_purge(store, "p", RemoteLogStartOffset(orders, 400, 3))
        await record_purge(store, "p", RemoteLogStartOffset(tp("gone", 0, b"\x09" * 16), 5, 3))  # no such history
        await store.put("p/purges/cut.json", b'{"key": ')  # never completed: skipped
        assert len(await recorded_purges(store, "p")) == 4
        out = await with_purges(store, "p", snap)
        assert out.name == snap.name and out.records[:3] == snap.records
        pc = ReplayedMetadata.of(out.records).cache.get(orders.topic_id, 0)
        assert pc is not None and pc.log_start_offset == 700
        assert len(out.records) == 5, "the two purges above the snapshot's, nothing else"

    asyncio.run(go())
