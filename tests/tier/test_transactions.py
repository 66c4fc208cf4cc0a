"""Transaction outcomes as facts of the tier (`tier.transactions`, issue 63 finding 1): what a pass records, the
restore's rule for what the lost cluster never decided, what a reader takes before a cluster's log, and the record
itself (its value, its key, a decided outcome final in the cache)."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

from protocol.records import Record, build_batch
from tests.support.segments import stored_segment, tp
from tierproxy.jobs.iceberg.files import SliceWritten
from tierproxy.jobs.iceberg.sync import held_back_from
from tierproxy.tier.cache import MetadataCache
from tierproxy.tier.indexes import AbortedTxn
from tierproxy.tier.model import SegmentState, TransactionOutcome, TxnOutcome, uuid_str
from tierproxy.tier.rsm import IndexType, RemoteStorageManager
from tierproxy.tier.serde import decode_value, encode_value, record_key
from tierproxy.tier.transactions import (
    COPIED,
    LOST_RULE,
    copied_outcomes,
    decided,
    lost_outcomes,
    recorded_outcomes,
    resolve_lost,
)

T = tp("orders", 1)


def outcome(pid: int, first: int, o: TxnOutcome, learnt: str = COPIED) -> TransactionOutcome:
    return TransactionOutcome(T, pid, first, o, learnt, 1_000)


def test_a_pass_records_what_its_fetch_reported() -> None:
    # P1 (7) open at the segment's end and listed aborted by the copy's READ_COMMITTED fetch; P3 (9) open at its end
    # and not listed: read below the last stable offset, it was decided, so committed
    got = copied_outcomes(T, {7: 100, 9: 140}, [(7, 100), (8, 20)], 1_000)
    assert got == [outcome(7, 100, TxnOutcome.ABORTED), outcome(9, 140, TxnOutcome.COMMITTED)]


def test_a_restore_aborts_what_the_lost_cluster_never_decided_once() -> None:
    recorded = {(7, 100): outcome(7, 100, TxnOutcome.ABORTED), (9, 140): outcome(9, 140, TxnOutcome.COMMITTED),
                (5, 90): outcome(5, 90, TxnOutcome.OPEN)}
    # open at the tier's end: 7 and 9 (recorded, decided: kept as recorded), 11 (not recorded: a tier written before
    # these records); 5 recorded OPEN
    got = resolve_lost(T, recorded, {7: 100, 9: 140, 11: 150}, 2_000)
    assert got == [TransactionOutcome(T, 5, 90, TxnOutcome.ABORTED, LOST_RULE, 2_000),
                   TransactionOutcome(T, 11, 150, TxnOutcome.ABORTED, LOST_RULE, 2_000)]


def test_a_reader_takes_a_recorded_outcome_before_the_clusters_log() -> None:
    recorded = {(7, 100): outcome(7, 100, TxnOutcome.ABORTED), (9, 140): outcome(9, 140, TxnOutcome.COMMITTED),
                (5, 90): outcome(5, 90, TxnOutcome.OPEN)}
    aborted, undecided = recorded_outcomes(recorded, {7: 100, 9: 140, 5: 90, 12: 160})
    assert aborted == [AbortedTxn(7, 100, -1, -1)]
    assert undecided == {5: 90, 12: 160}  # only these are asked of the cluster's log
    # a recorded outcome of another transaction of the same producer says nothing of this one
    assert recorded_outcomes(recorded, {7: 130}) == ([], {7: 130})
    assert decided(recorded) == {(7, 100): TxnOutcome.ABORTED, (9, 140): TxnOutcome.COMMITTED}


def test_the_record_round_trips_and_is_keyed_per_transaction() -> None:
    o = outcome(7, 100, TxnOutcome.ABORTED)
    assert decode_value(encode_value(o)) == o
    assert record_key(o) == f"{uuid_str(T.topic_id)}:1:txn:7:100".encode()


def test_a_decided_outcome_is_final_in_the_cache() -> None:
    cache = MetadataCache()
    cache.apply(outcome(7, 100, TxnOutcome.OPEN))
    cache.apply(outcome(7, 100, TxnOutcome.ABORTED, LOST_RULE))
    cache.apply(outcome(7, 100, TxnOutcome.OPEN))  # a late OPEN never undoes it
    pc = cache.get(T.topic_id, 1)
    assert pc is not None and pc.outcomes[(7, 100)].outcome == TxnOutcome.ABORTED


def test_the_iceberg_step_waits_for_no_recorded_outcome() -> None:
    # a slice ends with producer 7's transaction open from offset 100 (its marker is not tiered)
    s = SliceWritten(("f",), 10, "orders", 1, "id", "seg", 90, 120, 119, 0, {7: 100}, [])
    assert held_back_from([s]) == 100
    assert held_back_from([s], {(7, 100)}) is None  # recorded: nothing waits on it
    assert held_back_from([s], {(7, 90)}) == 100


def test_a_restore_reads_what_was_open_at_the_tier_end_from_the_last_segment(tmp_path: Path) -> None:
    """A real file tier whose last segment ends inside producer 7's transaction, with no outcome recorded (a tier
    written before these records): the restore's rule finds it in the segment's producer snapshot, aborted."""
    async def run() -> list[TransactionOutcome]:
        rsm = RemoteStorageManager.from_uri(f"file://{tmp_path}/tier")
        try:
            raw = build_batch([Record(0, 0, None, b"plain")], base_offset=0) + build_batch(
                [Record(1, 0, None, b"t0"), Record(2, 0, None, b"t1")], base_offset=1, producer_id=7,
                producer_epoch=0, base_sequence=0, transactional=True)
            md = await stored_segment(rsm, raw, "orders")
            cache = MetadataCache()
            cache.apply(md)
            cache.apply_record(dataclasses.replace(md, state=SegmentState.COPY_SEGMENT_FINISHED))
            pc = cache.get(md.tp.topic_id, md.tp.partition)
            assert pc is not None
            first = await lost_outcomes(pc, rsm, 3_000)
            cache.apply(first[0])  # recorded: a rerun of the restore finds nothing more to decide
            return [*first, *await lost_outcomes(pc, rsm, 4_000)]
        finally:
            await rsm.close()

    got = asyncio.run(run())
    assert [(o.producer_id, o.first_offset, o.outcome, o.learnt) for o in got] == [
        (7, 1, TxnOutcome.ABORTED, LOST_RULE)]


def test_a_missing_producer_snapshot_leaves_the_recorded_outcomes_resolved(tmp_path: Path) -> None:
    """A damaged tier (the last segment's producer snapshot gone): the restore does not fail at its last step; what
    is recorded OPEN is still aborted by the rule, and the missing object is said in the log."""
    async def run() -> list[TransactionOutcome]:
        rsm = RemoteStorageManager.from_uri(f"file://{tmp_path}/tier")
        try:
            md = await stored_segment(rsm, build_batch([Record(0, 0, None, b"plain")], base_offset=0), "orders")
            await rsm.store.delete(rsm.key(md, IndexType.PRODUCER_SNAPSHOT.value))
            cache = MetadataCache()
            cache.apply(md)
            cache.apply_record(dataclasses.replace(md, state=SegmentState.COPY_SEGMENT_FINISHED))
            cache.apply(TransactionOutcome(md.tp, 5, 0, TxnOutcome.OPEN, "a writer that could not tell", 1_000))
            pc = cache.get(md.tp.topic_id, md.tp.partition)
            assert pc is not None
            return await lost_outcomes(pc, rsm, 3_000)
        finally:
            await rsm.close()

    got = asyncio.run(run())
    assert [(o.producer_id, o.first_offset, o.outcome, o.learnt) for o in got] == [
        (5, 0, TxnOutcome.ABORTED, LOST_RULE)]
