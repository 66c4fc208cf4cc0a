"""A view that defers its segment records (`deferring`, the proxy's: `tier.cache`) describes the same tier as one
that applies each as it comes: the same segments, served lists, epochs, counts, live records and checkpoint,
whenever a partition is first read — at the end, between records, or never until a figure is asked — and the same
records skipped (malformed, or an illegal transition) with the same record live for their keys."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.segments import Partition, one_pass, seg, tp
from tests.tier.test_rlmm_replay import LogRLMM, Record
from tierproxy.tier.cache import DEFERRED, PartitionCache
from tierproxy.tier.model import PartitionDeleteState as PD
from tierproxy.tier.model import (
    RemoteLogSegmentMetadata,
    RemoteLogStartOffset,
    RemotePartitionDeleteMetadata,
    SegmentState,
    TransactionOutcome,
    TxnOutcome,
)
from tierproxy.tier.rlmm_topic import TopicRLMM
from tierproxy.tier.serde import decode_value, encode_value, record_key, segment_id_key

S = SegmentState


def reader(directory: Path | None = None, *, deferring: bool) -> TopicRLMM:
    r = TopicRLMM("127.0.0.1:1", partitions=1, checkpoint_dir=directory)
    r.deferring = deferring
    return r


def partition_view(pc: PartitionCache) -> dict[str, Any]:
    return {"tp": pc.tp, "segments": dict(pc.segments.items()), "unreferenced": set(pc.unreferenced),
            "epochs": {e: [(s, idx.ids[s]) for s in idx.starts] for e, idx in pc.epochs.items()},
            "served": list(pc.finished()), "summary": pc.summary(), "lineage": pc.lineage(),
            "log_start": pc.log_start_offset, "outcomes": dict(pc.outcomes), "earliest": pc.earliest_offset()}


def whole_view(r: TopicRLMM) -> dict[str, Any]:
    """Everything the view answers; the figures (`records_skipped`, `events_applied`) asked first, as a /metrics
    scrape does: they apply what was deferred."""
    figures = (r.records_skipped, r.cache.events_applied)
    return {"figures": figures, "partitions": {k: partition_view(pc) for k, pc in r.cache.partitions.items()},
            "order": list(r.cache.partitions), "by_name": dict(r.cache._by_name), "deletions": r.cache.deletions,
            "values": list(r.values.items()), "consumed": r.records_consumed}


def junk(log: list[Record], i: int, kind: int) -> Record:
    """A record that may fail when applied: a segment's record again as STARTED (illegal once the segment is
    known), a segment whose offsets the model refuses, or one cut short (malformed) of a partition nobody else
    names."""
    segment_records = [(k, v) for k, v in log if v is not None and v[0] == 0]
    key, value = segment_records[i % len(segment_records)]
    assert value is not None
    if kind == 0:
        md = decode_value(value)
        assert isinstance(md, RemoteLogSegmentMetadata)
        return key, encode_value(dataclasses.replace(md, state=S.COPY_SEGMENT_STARTED))
    if kind == 1:
        bad = bytearray(value)
        p = 2 + bad[2] + 38  # the start offset: past the end offset
        bad[p:p + 8] = (2**62).to_bytes(8, "big")
        return key, bytes(bad)
    return b"junk-" + bytes([i % 256]), encode_value(seg(tp(f"junk{i}"), 0, 9))[:-9]


passes = st.lists(st.tuples(st.integers(0, 1), st.integers(1, 40), st.sets(st.integers(0, 6), max_size=2),
                            st.integers(0, 1)), min_size=1, max_size=8)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(passes=passes, reads=st.sets(st.integers(0, 400), max_size=6), junks=st.dictionaries(
    st.integers(0, 400), st.integers(0, 2), max_size=4), others=st.sets(st.integers(0, 400), max_size=4))
def test_a_deferring_view_is_the_view_that_applies_each_record(
        tmp_path: Path, passes: list[tuple[int, int, set[int], int]], reads: set[int], junks: dict[int, int],
        others: set[int]) -> None:
    """Two partitions tiered in random passes (copies failing, retention deleting), junk records, purges and
    transaction outcomes between them; the deferring view's partitions read at random points. Both views fed the
    same records as the topic consumer applies them, then compared whole, and their checkpoints byte for byte."""
    async def go() -> None:
        parts = [tp("left"), tp("right", 1)]
        writer = LogRLMM()
        for which, per, failing, expire in passes:
            await one_pass(writer, parts[which], Partition([7, 13, 5, 21, 9, 30, 2]), per, failing, expire)
        log: list[Record] = []
        for i, record in enumerate(writer.log):
            if i in junks:
                log.append(junk(writer.log, i, junks[i]))
            if i in others:  # the events applied at once, between deferred records
                t = parts[i % 2]
                event: RemoteLogStartOffset | TransactionOutcome = RemoteLogStartOffset(t, i, 1) if i % 3 else \
                    TransactionOutcome(t, 7, i, TxnOutcome.ABORTED, "test", 1)
                log.append((record_key(event), encode_value(event)))
            log.append(record)
        eager, deferring = reader(tmp_path / "eager", deferring=False), reader(tmp_path / "lazy", deferring=True)
        for offset, (key, value) in enumerate(log):
            eager._apply(0, offset, key, value)
            deferring._apply(0, offset, key, value)
            if offset in reads:  # a partition read between records: what came before applied, the rest after
                pc = deferring.cache.get(parts[offset % 2].topic_id, parts[offset % 2].partition)
                if pc is not None:
                    pc.segment_for_offset(offset)
        for r in (eager, deferring):
            r.positions[0] = len(log)
            r.write_checkpoint()  # the deferring one's: what it has not applied yet written as it came
        reloaded = [reader(tmp_path / "eager", deferring=False), reader(tmp_path / "lazy", deferring=True)]
        for r in reloaded:
            assert r.load_checkpoint() == {0: len(log)}
        assert whole_view(reloaded[1]) == whole_view(reloaded[0]), "the next start's view"
        assert whole_view(deferring) == whole_view(eager) and not deferring.cache._unindexed
        deferring.write_checkpoint()  # all applied now: the same file
        assert (tmp_path / "lazy" / f"{deferring.topic}.checkpoint").read_bytes() == \
            (tmp_path / "eager" / f"{eager.topic}.checkpoint").read_bytes()

    asyncio.run(go())


def test_a_start_defers_every_segment_record_and_a_read_applies_one_partition() -> None:
    """What a start costs: the records kept, grouped by partition, nothing made; the first read of a partition
    makes that one only; a record arriving for a partition not yet read is deferred too, one for a partition
    read is deferred and applied at its next read."""
    a, b = tp("a"), tp("b", 3)
    r = reader(deferring=True)
    offset = 0
    for t in (a, b):
        for i in range(5):
            md = dataclasses.replace(seg(t, i * 10, i * 10 + 9), state=S.COPY_SEGMENT_FINISHED)
            r._apply(0, offset, record_key(md), encode_value(md))
            offset += 1
    pa, pb = r.cache.get(a.topic_id, 0), r.cache.get(b.topic_id, 3)
    assert pa is not None and pb is not None
    assert pa._pending is not None and len(pa._pending) == 5 * DEFERRED and not pa._segments  # kept, not applied
    assert r.cache._events_applied == 0 and r.records_consumed == 10
    found = r.cache.find("a", 0)
    assert found is pa and found.segment_for_offset(23) is not None  # read: applied
    assert pa._pending is None and len(pa._segments) == 5 and pb._pending is not None and not pb._segments
    late = dataclasses.replace(seg(b, 50, 59), state=S.COPY_SEGMENT_FINISHED)
    r._apply(0, offset, record_key(late), encode_value(late))
    assert pb._pending is not None and len(pb._pending) == 6 * DEFERRED
    more = dataclasses.replace(seg(a, 50, 59), state=S.COPY_SEGMENT_FINISHED)
    r._apply(0, offset + 1, record_key(more), encode_value(more))
    assert pa._pending is not None and len(pa._segments) == 5  # deferred again, applied at the next read
    assert pa.latest_tiered_offset() == 59 and pa._pending is None
    assert pb.summary()[0] == 6 and r.cache.events_applied == 12


def test_a_deferred_record_that_fails_is_skipped_as_at_once() -> None:
    """An illegal STARTED of a known segment under a key of its own: live until its partition is read, then
    skipped, counted and logged, and not live, as if applied at once; under a live key: applied at once."""
    t = tp("a")
    started = seg(t, 0, 9)
    done = dataclasses.replace(started, state=S.COPY_SEGMENT_FINISHED)
    views = [reader(deferring=False), reader(deferring=True)]
    for r in views:
        r._apply(0, 0, segment_id_key(started.segment_id), encode_value(started))
        r._apply(0, 1, record_key(done), encode_value(done))
        r._apply(0, 2, b"a-key-of-its-own", encode_value(started))  # a STARTED again: illegal
    eager, deferring = views
    assert deferring.values[b"a-key-of-its-own"] == encode_value(started) and deferring._records_skipped == 0
    for r in views:  # the same under a live key: applied at once, what its partition deferred first
        r._apply(0, 3, record_key(done), encode_value(started))
    assert deferring._records_skipped == 2 and not deferring.cache._unindexed
    assert deferring.records_skipped == eager.records_skipped == 2  # the figure applies what was deferred
    assert list(deferring.values.items()) == list(eager.values.items()) and b"a-key-of-its-own" not in eager.values
    assert whole_view(deferring) == whole_view(eager)


def test_a_partition_deleted_applies_what_it_deferred_before_it_goes() -> None:
    t = tp("gone")
    md = seg(t, 0, 9)
    views = [reader(deferring=False), reader(deferring=True)]
    for r in views:
        r._apply(0, 0, segment_id_key(md.segment_id), encode_value(md))
        r._apply(0, 1, b"again", encode_value(md))  # illegal: counted whether applied now or when deleted
        for n, state in enumerate((S.DELETE_SEGMENT_STARTED, S.DELETE_SEGMENT_FINISHED)):
            r._apply(0, 2 + n, segment_id_key(md.segment_id), encode_value(dataclasses.replace(md, state=state)))
        for n, pstate in enumerate((PD.DELETE_PARTITION_MARKED, PD.DELETE_PARTITION_STARTED,
                                     PD.DELETE_PARTITION_FINISHED)):
            pdm = RemotePartitionDeleteMetadata(t, pstate, 1, 1)
            r._apply(0, 4 + n, record_key(pdm), encode_value(pdm))
    eager, deferring = views
    assert deferring._records_skipped == eager._records_skipped >= 1 and not deferring.cache._unindexed
    assert whole_view(deferring) == whole_view(eager) and not deferring.cache.partitions


def test_a_view_read_while_its_checkpoint_loads_loses_no_record(tmp_path: Path) -> None:
    """`serve` loads its checkpoint on a worker thread (`TopicRLMM._start`) while the loop answers /metrics, whose
    sums apply what was deferred: a partition applied by the loop between the loader's glance at a record and its
    keeping dropped the record (its segment never served), or the sums failed on the loader's changing set.
    Held halfway, the loader's records are not applied from the loop; then, free, a short switch interval and
    repeated loads make the race likely (records were lost in about 1 load of 30 before)."""
    import sys
    import threading

    eager = reader(tmp_path, deferring=False)
    parts = [tp(f"t{i}") for i in range(40)]
    offset = 0
    for t in parts:
        for i in range(100):
            md = dataclasses.replace(seg(t, i * 10, i * 10 + 9), state=S.COPY_SEGMENT_FINISHED)
            eager._apply(0, offset, record_key(md), encode_value(md))
            offset += 1
    eager.positions = {0: offset}
    eager.write_checkpoint()
    want = {k: pc.summary() for k, pc in eager.cache.partitions.items()}

    class Paused(TopicRLMM):  # the loader held after half the records, while the "loop" reads
        def apply_record(self, key: bytes | None, value: bytes | None, source: int = -1, offset: int = -1) -> None:
            super().apply_record(key, value, source, offset)
            if len(self.values) == offset_half:
                halfway.set()
                resume.wait(10)

    offset_half, halfway, resume = offset // 2, threading.Event(), threading.Event()
    paused = Paused("127.0.0.1:1", partitions=1, checkpoint_dir=tmp_path)
    paused.deferring = True
    loading = threading.Thread(target=paused.load_checkpoint)
    loading.start()
    assert halfway.wait(10)
    held = {k: (pc._pending or []).copy() for k, pc in paused.cache.partitions.items()}
    paused.cache.index_all()  # a scrape's sums, and a partition read, from the loop meanwhile
    for pc in list(paused.cache.partitions.values()):
        pc.summary()
    assert {k: pc._pending for k, pc in paused.cache.partitions.items()} == held, "applied from another thread"
    resume.set()
    loading.join()
    assert {k: pc.summary() for k, pc in paused.cache.partitions.items()} == want
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for _ in range(20):
            r = reader(tmp_path, deferring=True)
            loading = threading.Thread(target=r.load_checkpoint)
            loading.start()
            while loading.is_alive():  # the loop meanwhile: a scrape's sums
                r.cache.index_all()
            loading.join()
            assert {k: pc.summary() for k, pc in r.cache.partitions.items()} == want
    finally:
        sys.setswitchinterval(interval)


@pytest.mark.parametrize("order", ["retired after", "retired before", "key taken by another"])
def test_a_deferred_record_in_a_checkpoint_is_replayed_after_what_it_came_after(tmp_path: Path, order: str) -> None:
    """A record kept unapplied is written to the checkpoint as it came, to fail again at the next start: it must
    meet there what it met on arrival. A segment being deleted and a FINISHED of it under another key (illegal);
    the deleting record's key retired after or before the FINISHED came, or taken by another partition's record:
    the next start must not serve the segment, as the view that applies each record at once never does."""
    t = tp("a")
    md = seg(t, 0, 9)
    key = segment_id_key(md.segment_id)
    deleting = encode_value(dataclasses.replace(md, state=S.DELETE_SEGMENT_STARTED))
    finished = (b"another-writer:" + key, encode_value(dataclasses.replace(md, state=S.COPY_SEGMENT_FINISHED)))
    retired = (key, None if order != "key taken by another" else encode_value(seg(tp("b"), 0, 9)))
    records = [(key, deleting), finished, retired] if order == "retired after" else [(key, deleting), retired,
                                                                                      finished]
    views = [reader(tmp_path / "eager", deferring=False), reader(tmp_path / "lazy", deferring=True)]
    for r in views:
        for offset, (k, v) in enumerate(records):
            r._apply(0, offset, k, v)
        r.positions[0] = len(records)
        r.write_checkpoint()
    restarted = [reader(tmp_path / "eager", deferring=False), reader(tmp_path / "lazy", deferring=True)]
    for r in restarted:
        assert r.load_checkpoint() == {0: len(records)}
    eager, lazy = restarted
    pc = lazy.cache.find("a", 0)
    assert pc is None or pc.segment_for_offset(5) is None, "a segment being deleted served after a restart"
    assert whole_view(lazy) == whole_view(eager)


def test_a_segment_moving_to_its_finished_key_keeps_its_partition_deferring() -> None:
    """The tier job's usual lifecycle (STARTED under the id key, FINISHED under the KIP key, the id key retired)
    leaves no state resting on a retired record: the partition's next records are still deferred."""
    t = tp("a")
    r = reader(deferring=True)
    started = seg(t, 0, 9)
    done = dataclasses.replace(started, state=S.COPY_SEGMENT_FINISHED)
    r._apply(0, 0, segment_id_key(started.segment_id), encode_value(started))
    r._apply(0, 1, record_key(done), encode_value(done))
    r._apply(0, 2, segment_id_key(started.segment_id), None)
    pc = r.cache.get(t.topic_id, 0)
    assert pc is not None and not pc.at_once
    later = seg(t, 10, 19)
    r._apply(0, 3, segment_id_key(later.segment_id), encode_value(later))
    assert pc._pending is not None and len(pc._pending) == DEFERRED
    assert pc.latest_tiered_offset() == 9 and len(pc.segments) == 2
