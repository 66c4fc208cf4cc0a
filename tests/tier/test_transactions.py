"""Transaction outcomes as facts of the tier (`tier.transactions`, issue 63 finding 1): what a pass records, the
restore's rule for what the lost cluster never decided, what a reader takes before a cluster's log, and the record
itself (its value, its key, a decided outcome final in the cache)."""

from __future__ import annotations

from tests.support.segments import tp
from tierproxy.jobs.iceberg.files import SliceWritten
from tierproxy.jobs.iceberg.sync import held_back_from
from tierproxy.tier.cache import MetadataCache
from tierproxy.tier.indexes import AbortedTxn
from tierproxy.tier.model import TransactionOutcome, TxnOutcome, uuid_str
from tierproxy.tier.serde import decode_value, encode_value, record_key
from tierproxy.tier.transactions import (
    COPIED,
    LOST_RULE,
    copied_outcomes,
    decided,
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
