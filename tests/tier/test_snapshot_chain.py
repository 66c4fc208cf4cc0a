"""Incremental tier snapshots (format 3): a pass writes what changed, readers get the whole live records or an older
snapshot whole, never a part; a restarted writer continues the chain; a restore plans the same from either form."""

from __future__ import annotations

import asyncio
import os
import random
from pathlib import Path
from typing import Any

import pytest

from tests.support.segments import seg, tp
from tierproxy.jobs.restore.plan import choose_facts, replay
from tierproxy.tier import snapshot as snapshots
from tierproxy.tier import snapshot_chain as chains
from tierproxy.tier.model import SegmentState
from tierproxy.tier.rlmm import ReplayedMetadata, transition
from tierproxy.tier.serde import encode_value, record_key
from tierproxy.tier.snapshot import PartitionFacts, SnapshotWriter, TierSnapshot, TopicFacts
from tierproxy.tier.storage import FileStore, StorageUnavailable


class Tier:
    """A metadata view growing as a tier does: segments added, finished, deleted (their keys tombstoned)."""

    def __init__(self, seed: int, partitions: int = 8) -> None:
        self.rng = random.Random(seed)
        self.view = ReplayedMetadata()
        self.tps = [tp("orders", p, b"\x07" * 16) for p in range(partitions)]
        self.ends = dict.fromkeys(range(partitions), 0)

    def grow(self, added: int, deleted: int = 0) -> None:
        for _ in range(added):
            p = self.rng.randrange(len(self.tps))
            md = seg(self.tps[p], self.ends[p], self.ends[p] + 99, seg_id=self.rng.randbytes(16))
            self.ends[p] += 100
            done = md.with_update(transition(md, SegmentState.COPY_SEGMENT_FINISHED))
            self.view.apply_record(record_key(md), encode_value(done))
        keys = [k for k in self.view.values if k.startswith(b"tierproxy:") is False]
        for key in self.rng.sample(keys, min(deleted, len(keys))):
            self.view.apply_record(key, None)

    def snap(self, taken: int) -> TierSnapshot:
        return TierSnapshot("A", taken, f"r{taken}", None, None,
                            {"orders": TopicFacts("orders", "BwcHBwcHBwcHBwcHBwcHBw", "x", len(self.tps), 1, {})},
                            [PartitionFacts("orders", p, self.ends[p], 0, 0) for p in self.ends],
                            records=self.view.live_records())


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def tracked_after_one_pass(store: FileStore, seed: int, records: int) -> tuple[SnapshotWriter, Tier]:
    """A tier job's writer (told what changed) that has written its first pass of a tier of `records` segments."""
    tier = Tier(seed)
    writer = SnapshotWriter(store, "p", tracked=True)
    tier.grow(records)
    tier.view.take_changed()
    run(writer.write(tier.snap(1)))
    return writer, tier


@pytest.mark.parametrize("tracked", [False, True], ids=["compared", "told"])
def test_each_pass_reads_back_as_the_live_records_and_writes_what_changed(tmp_path: Path, tracked: bool) -> None:
    """"told": the metadata view says what changed since the last pass (as in a tier job), nothing is compared."""
    store, tier = FileStore(tmp_path), Tier(1)
    writer = SnapshotWriter(store, "p", tracked=tracked)
    tier.grow(3000)
    tier.view.take_changed()
    total = 0
    for taken in range(1, 60):
        changed = tier.view.take_changed() if tracked and taken > 1 else None
        run(writer.write(tier.snap(taken), changed))
        total += writer.last_bytes
        newest = run(snapshots.newest(store, "p"))
        assert newest is not None and newest.run_id == f"r{taken}"
        assert newest.records == tier.view.live_records(), f"pass {taken}"  # the same records, the same order
        if taken == 1:
            base_bytes = writer.last_bytes
        elif len(newest.chain) > 2:  # a delta (not a base, nor the deltas merged into one): what changed
            assert writer.last_bytes < base_bytes / 10, (taken, writer.last_bytes, base_bytes)
        assert len(newest.chain) <= chains.MAX_DELTAS + 1
        tier.grow(added=10, deleted=3 if taken % 5 == 0 else 0)
    assert total < 2.5 * base_bytes, "59 passes of a few changes each cost about two bases, not 59"
    objects = run(store.list("p/snapshots/records/"))
    named = {f"p/{n}" for k in run(store.list("p/snapshots/")) if k.endswith(".json")
             for n in TierSnapshot.decode(run(store.get(k))).chain}
    assert set(objects) == named, "every record object a kept root names, and no other"


def test_nothing_new_writes_only_the_root(tmp_path: Path) -> None:
    store, tier = FileStore(tmp_path), Tier(2)
    writer = SnapshotWriter(store, "p")
    tier.grow(500)
    run(writer.write(tier.snap(1)))
    before = run(store.list("p/snapshots/records/"))
    run(writer.write(tier.snap(2)))
    assert run(store.list("p/snapshots/records/")) == before
    newest = run(snapshots.newest(store, "p"))
    assert newest is not None and newest.run_id == "r2" and newest.records == tier.view.live_records()


class FailingRoot(FileStore):
    """A store whose process is killed between a record object and its root (the root's put never happens)."""

    fail = False

    async def put(self, key: str, data: bytes) -> None:
        if self.fail and key.endswith(".json"):
            raise StorageUnavailable("killed")
        await super().put(key, data)


def test_a_told_pass_that_failed_is_written_by_the_next_one(tmp_path: Path) -> None:
    store = FailingRoot(tmp_path)
    writer, tier = tracked_after_one_pass(store, 8, 2000)
    tier.grow(20, deleted=5)
    store.fail = True
    with pytest.raises(StorageUnavailable):
        run(writer.write(tier.snap(2), tier.view.take_changed()))
    store.fail = False
    tier.grow(20)
    run(writer.write(tier.snap(3), tier.view.take_changed()))  # told only of the last 20: the 25 before are kept
    newest = run(snapshots.newest(store, "p"))
    assert newest is not None and newest.run_id == "r3" and newest.records == tier.view.live_records()


def test_a_pass_killed_before_its_root_leaves_the_snapshot_before_whole_and_the_next_writer_continues(
        tmp_path: Path) -> None:
    store, tier = FailingRoot(tmp_path), Tier(3)
    tier.grow(2000)
    run(SnapshotWriter(store, "p").write(tier.snap(1)))
    tier.grow(20)
    writer = SnapshotWriter(store, "p")
    run(writer.write(tier.snap(2)))
    whole = tier.view.live_records()
    tier.grow(20, deleted=5)
    store.fail = True
    with pytest.raises(StorageUnavailable):
        run(writer.write(tier.snap(3)))
    newest = run(snapshots.newest(store, "p"))
    assert newest is not None and newest.run_id == "r2" and newest.records == whole
    store.fail = False
    again = SnapshotWriter(store, "p")  # a new process: reads the chain once, writes a delta, not a base
    run(again.write(tier.snap(4)))
    newest = run(snapshots.newest(store, "p"))
    assert newest is not None and newest.records == tier.view.live_records()
    assert newest.chain[0] == "snapshots/records/00000000000000000001-r1.rec" and len(newest.chain) == 3
    assert again.last_bytes < 8000, again.last_bytes
    assert "p/snapshots/records/00000000000000000003-r3.rec" not in run(store.list("p/snapshots/records/")), \
        "the killed pass's object is removed once no root names it"


def test_a_chain_object_cut_short_makes_its_root_unreadable_and_the_one_before_is_read(tmp_path: Path) -> None:
    store, tier = FileStore(tmp_path), Tier(4)
    tier.grow(1000)
    writer = SnapshotWriter(store, "p")
    run(writer.write(tier.snap(1)))
    tier.grow(10)
    run(writer.write(tier.snap(2)))
    before = tier.view.live_records()
    tier.grow(10)
    run(writer.write(tier.snap(3)))
    delta = tmp_path / "p" / "snapshots" / "records" / "00000000000000000003-r3.rec"
    for cut in (delta.read_bytes()[:-3], b"", os.urandom(64)):
        delta.write_bytes(cut)
        newest = run(snapshots.newest(store, "p"))
        assert newest is not None and newest.run_id == "r2" and newest.records == before
        found = run(snapshots.of_cluster(store, "p"))
        assert [s.run_id for s in found] == ["r2", "r1"] and found[0].records == before
    delta.unlink()
    newest = run(snapshots.newest(store, "p"))
    assert newest is not None and newest.run_id == "r2"


def test_a_whole_snapshot_of_an_earlier_version_is_read_and_followed_by_a_base(tmp_path: Path) -> None:
    store, tier = FileStore(tmp_path), Tier(5)
    tier.grow(300)
    run(snapshots.write(store, "p", tier.snap(1)))  # format 2, records inside
    tier.grow(5)
    writer = SnapshotWriter(store, "p")
    run(writer.write(tier.snap(2)))
    newest = run(snapshots.newest(store, "p"))
    assert newest is not None and newest.chain == ["snapshots/records/00000000000000000002-r2.rec"]
    assert newest.records == tier.view.live_records()
    older = run(snapshots.of_cluster(store, "p"))[1]
    assert older.run_id == "r1" and len(older.records) == 300


def test_a_restore_plans_the_same_from_an_incremental_snapshot_as_from_a_whole_one(tmp_path: Path) -> None:
    tier = Tier(6)
    whole, incremental = FileStore(tmp_path / "whole"), FileStore(tmp_path / "incremental")
    writer = SnapshotWriter(incremental, "")
    for taken in range(1, 25):
        tier.grow(40, deleted=4)
        run(snapshots.write(whole, "", tier.snap(taken)))
        run(writer.write(tier.snap(taken)))
    a, b = (choose_facts(run(snapshots.of_cluster(s, ""))) for s in (whole, incremental))
    assert a.snapshot.records == b.snapshot.records and a.snapshot.partitions == b.snapshot.partitions
    va, vb = replay(a.snapshot), replay(b.snapshot)
    for t in tier.tps:
        assert [s.segment_id for s in va.get(t.topic_id, t.partition).all_segments()] == \
               [s.segment_id for s in vb.get(t.topic_id, t.partition).all_segments()]  # type: ignore[union-attr]


def test_a_record_object_round_trips_and_refuses_anything_else() -> None:
    records: chains.Records = [(b"k", b"v"), (b"gone", None), (b"", b""), (b"k2", os.urandom(300))]
    raw = chains.encode_records(records)
    assert chains.decode_records(raw) == records
    for bad in (raw[:-1], raw + b"x", b"", b"TPSR", chains.encode_records([])[:4]):
        with pytest.raises(chains.ChainBroken):
            chains.decode_records(bad)


def test_a_writer_whose_clock_is_behind_never_deletes_its_own_root_or_what_it_names(tmp_path: Path) -> None:
    """A tier job restarted on a host whose clock is behind the last one's: its roots sort before five newer
    names. Found by review: the clean-up deleted the root it had just written and its delta, the chain went on
    naming them, and once the clock caught up no snapshot was readable."""
    store, tier = FileStore(tmp_path), Tier(9)
    tier.grow(2000)
    ahead = SnapshotWriter(store, "p")
    for taken in range(10_000, 10_005):
        tier.grow(5)
        run(ahead.write(tier.snap(taken)))
    behind = SnapshotWriter(store, "p", tracked=True)
    tier.view.take_changed()
    for i, taken in enumerate([5_000, 5_001, 10_006, 10_007, 10_008, 10_009, 10_010]):
        tier.grow(5, deleted=1)
        key = run(behind.write(tier.snap(taken), tier.view.take_changed() if i else None))
        mine = run(snapshots.read(store, "p", key.removeprefix("p/")))  # its root and every object it names
        assert mine.records == tier.view.live_records(), taken
    newest = run(snapshots.newest(store, "p"))
    assert newest is not None and newest.run_id == "r10010" and newest.records == tier.view.live_records()


def test_changes_taken_before_a_failure_are_written_by_the_next_pass(tmp_path: Path) -> None:
    """The tier job hands what the view says changed to the writer (`note`) before it builds the snapshot, which
    may fail (the cluster unreachable): the next pass writes them. A tracked writer told nothing after its first
    pass writes a base rather than miss a tombstone."""
    store = FileStore(tmp_path)
    writer, tier = tracked_after_one_pass(store, 10, 1500)
    tier.grow(10, deleted=20)
    writer.note(tier.view.take_changed())  # ... and building the snapshot failed: no write this pass
    tier.grow(10)
    writer.note(tier.view.take_changed())
    run(writer.write(tier.snap(3)))
    newest = run(snapshots.newest(store, "p"))
    assert newest is not None and newest.records == tier.view.live_records() and len(newest.chain) == 2
    tier.grow(5, deleted=5)
    tier.view.take_changed()  # taken and dropped by a caller that never told the writer
    run(writer.write(tier.snap(4)))
    newest = run(snapshots.newest(store, "p"))
    assert newest is not None and newest.records == tier.view.live_records()
    assert newest.chain == ["snapshots/records/00000000000000000004-r4.rec"], "a base, the whole again"
