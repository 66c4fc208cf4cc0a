"""Transaction outcomes as facts of the tier, each rule once: what a pass records, how a restore resolves what the
lost cluster never decided, and what a reader takes before asking a cluster's log.

A tiered segment can end inside a transaction whose marker lies above what the tier holds (P1 writes, P2 opens a
transaction after P1's records, P1 aborts: the last stable offset stops at P2's first record, so a pass copies P1's
records but not its marker). Before a loss the cluster's log knows the outcome; after a restore the new cluster's
log begins at S and knows nothing of it. So:

- **The pass records it** (`copied_outcomes`): a copy reads READ_COMMITTED below the last stable offset, so every
  transaction whose records it copied was decided when they were read, and the same fetch lists the aborted ones:
  each transaction open at a copied segment's end is recorded ABORTED if the broker listed it, else COMMITTED.
  Recorded with the segment's COPY_SEGMENT_FINISHED, in the same publish.
- **A restore resolves the rest once, by rule** (`resolve_lost`): a transaction open at the tier's end that is
  recorded OPEN, or not recorded at all (a tier written before these records), had its end in [N, S), lost with
  the cluster: it is recorded ABORTED (`LOST_RULE`), and the restore reports it.
- **A reader takes recorded outcomes first** (`recorded_outcomes`): a decided one is final; only an undecided one is
  looked up in the cluster's log (the proxy, the Spark reader and the Iceberg step alike), and nothing waits for a
  marker no segment will ever bring.
- **A transaction is followed only through segments that follow on** (`followed_through`): past a gap the tier
  does not hold where its marker may lie, and after a restore the segments past the gap [N, S) are the new
  cluster's, whose producer ids begin again: a producer id there says nothing of the lost cluster's transactions.
  So a recorded abort whose marker no segment holds reaches only the last of those segments whose producer
  snapshot still holds it open (`unmarked_aborts`): never the new cluster's, nor a later transaction of its
  producer.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping

from tierproxy.tier.cache import PartitionCache
from tierproxy.tier.indexes import AbortedTxn, decode_producer_snapshot
from tierproxy.tier.model import RemoteLogSegmentMetadata, TopicIdPartition, TransactionOutcome, TxnOutcome
from tierproxy.tier.rsm import IndexType, RemoteStorageManager
from tierproxy.tier.rules import served_segments
from tierproxy.tier.storage import ObjectMissing

log = logging.getLogger("tierproxy.tier.transactions")

COPIED = "the cluster's log, when the pass copied its records"
LOST_RULE = "restore: open at the tier's end, its end lost with the cluster ([N, S)): aborted by rule"
OPEN_ABOVE = 1 << 62  # the last offset of a transaction whose marker is only in the broker's log, above the tier


def copied_outcomes(tp: TopicIdPartition, open_at_end: Mapping[int, int], aborted: Iterable[tuple[int, int]],
                    now_ms: int) -> list[TransactionOutcome]:
    """The outcomes a pass records for the transactions open at a copied segment's end (`open_at_end`: producer id
    → first offset): ABORTED those the copy's READ_COMMITTED fetch listed (`aborted`: producer id, first offset),
    COMMITTED the others (read below the last stable offset: decided, and not aborted)."""
    listed = set(aborted)
    return [TransactionOutcome(tp, pid, first, TxnOutcome.ABORTED if (pid, first) in listed else TxnOutcome.COMMITTED,
                               COPIED, now_ms) for pid, first in sorted(open_at_end.items())]


def resolve_lost(tp: TopicIdPartition, recorded: Mapping[tuple[int, int], TransactionOutcome],
                 open_at_end: Mapping[int, int], now_ms: int) -> list[TransactionOutcome]:
    """A restore's rule for a partition of a lost cluster: every transaction recorded OPEN, and every one open at
    the tier's end (`open_at_end`, from the last segment's producer snapshot) without a recorded outcome, is
    ABORTED — its marker, if any, was in [N, S) and is gone. Decided ones stay as recorded."""
    undecided = {key for key, o in recorded.items() if not o.decided}
    undecided |= {(pid, first) for pid, first in open_at_end.items() if (pid, first) not in recorded}
    return [TransactionOutcome(tp, pid, first, TxnOutcome.ABORTED, LOST_RULE, now_ms) for pid, first in
            sorted(undecided)]


async def lost_outcomes(pc: PartitionCache, rsm: RemoteStorageManager, now_ms: int) -> list[TransactionOutcome]:
    """`resolve_lost` for a partition of a lost cluster, the transactions open at its tier's end read from its last
    served segment's producer snapshot (one GET; none when nothing is served)."""
    served = served_segments(pc.finished(), pc.log_start_offset)
    open_at_end: dict[int, int] = {}
    if served:
        try:
            snapshot = decode_producer_snapshot(await rsm.fetch_index(served[-1], IndexType.PRODUCER_SNAPSHOT))
        except ObjectMissing as exc:  # a damaged tier: the recorded outcomes are resolved, the rest is said
            log.warning("%s-%d: the last segment's producer snapshot is missing (%s): a transaction open at the "
                        "tier's end without a recorded outcome is not resolved", pc.tp.topic, pc.tp.partition, exc)
            snapshot = {}
        open_at_end = {pid: e.current_txn_first_offset for pid, e in snapshot.items()
                       if e.current_txn_first_offset >= 0}
    return resolve_lost(pc.tp, pc.outcomes, open_at_end, now_ms)


def recorded_outcomes(recorded: Mapping[tuple[int, int], TransactionOutcome], open_txns: Mapping[int, int]
                      ) -> tuple[list[AbortedTxn], dict[int, int]]:
    """Of transactions open at the tier's end (`open_txns`: producer id → first offset), those the tier records
    decided: (the aborted ones, as a fetch answer lists them; the undecided rest, for the cluster's log)."""
    aborted, undecided = [], {}
    for pid, first in open_txns.items():
        o = recorded.get((pid, first))
        if o is None or not o.decided:
            undecided[pid] = first
        elif o.outcome == TxnOutcome.ABORTED:
            aborted.append(AbortedTxn(pid, first, -1, -1))
    return aborted, undecided


def decided(recorded: Mapping[tuple[int, int], TransactionOutcome]) -> dict[tuple[int, int], TxnOutcome]:
    """(producer id, first offset) → outcome of every decided transaction recorded (a reader's whole-partition
    view: the Spark planner's aborted list, the Iceberg step's transactions it no longer waits for)."""
    return {key: o.outcome for key, o in recorded.items() if o.decided}


def followed_through(end: int, later: Iterable[RemoteLogSegmentMetadata]) -> Iterator[RemoteLogSegmentMetadata]:
    """Of the segments `later` (any order), those that follow on without a gap from offset `end` (a segment's end),
    in offset order: as far as the tier follows a transaction open at `end`. The first gap ends them."""
    for md in sorted(later, key=lambda m: m.start_offset):
        if md.start_offset > end + 1:
            return
        if md.end_offset > end:
            yield md
            end = md.end_offset


async def unmarked_aborts(recorded: Mapping[tuple[int, int], TxnOutcome], marked: Iterable[tuple[int, int]],
                          segments: Iterable[RemoteLogSegmentMetadata], rsm: RemoteStorageManager
                          ) -> list[tuple[int, int, int]]:
    """(producer id, first offset, last offset) of each transaction recorded aborted whose marker no segment holds
    (`marked`: those the segments' transaction indexes list). Its records reach the end of the last segment, of
    those that follow on from the one holding its first offset (`followed_through`), whose producer snapshot
    still holds it open (one GET each, as far as it goes): never a later segment, where a marker would have
    been indexed, nor, after a restore, the new cluster's (even where it begins right at the tier's end, S = N).
    None for one whose first offset no segment holds (nothing of it is read)."""
    listed, segments = set(marked), list(segments)
    out = []
    for (pid, first), outcome in sorted(recorded.items()):
        if outcome != TxnOutcome.ABORTED or (pid, first) in listed:
            continue
        last = -1
        for md in followed_through(first - 1, segments):
            if last < 0:
                last = md.end_offset  # the segment holding its first offset
            entry = decode_producer_snapshot(await rsm.fetch_index(md, IndexType.PRODUCER_SNAPSHOT)).get(pid)
            if entry is None or entry.current_txn_first_offset != first:
                break  # not open at this segment's end: it ended before it, or inside it (the first one)
            last = md.end_offset
        if last >= first:
            out.append((pid, first, last))
    return out
