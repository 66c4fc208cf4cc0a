"""Transactions as the cleaner walks the log (Kafka's CleanedTransactionMetadata): which data batches belong to
aborted transactions, which markers may go, and the txn index entries of a cleaned segment."""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence

from protocol.records import ABORT, COMMIT, RecordBatch
from tierproxy.tier.indexes import AbortedTxn


class CleanedTransactions:
    """Fed every batch in offset order; says whether a batch may be discarded by transaction state."""

    def __init__(self) -> None:
        self._committed: set[int] = set()  # producers with a committed transaction in progress
        self._aborted: dict[int, tuple[AbortedTxn, list[int]]] = {}  # producer → (txn, [last observed offset])
        self._pending: list[tuple[int, int, AbortedTxn]] = []  # min-heap on first offset
        self._seq = 0
        self.index: list[AbortedTxn] | None = None  # where the retained aborted transactions' entries go

    def add_aborted(self, txns: Iterable[AbortedTxn]) -> None:
        for t in txns:
            self._seq += 1
            heapq.heappush(self._pending, (t.first_offset, self._seq, t))

    def _consume_up_to(self, offset: int) -> None:
        while self._pending and self._pending[0][0] <= offset:
            txn = heapq.heappop(self._pending)[2]
            self._aborted.setdefault(txn.producer_id, (txn, []))

    def on_control_batch(self, batch: RecordBatch, control_type: int | None) -> bool:
        """True when the marker may be discarded (its transaction left no batch in this pass).
        `control_type` None: the control batch is empty (already cleaned)."""
        self._consume_up_to(batch.last_offset)
        if control_type is None:
            return True
        pid = batch.producer_id
        if control_type == ABORT:
            entry = self._aborted.pop(pid, None)
            if entry is not None and entry[1]:
                if self.index is not None:
                    self.index.append(entry[0])
                return False
            return True
        if control_type == COMMIT:
            if pid in self._committed:
                self._committed.discard(pid)
                return False
            return True
        return False

    def on_data_batch(self, transactional: bool, producer_id: int, last_offset: int) -> bool:
        """True when the batch belongs to an aborted transaction (its records all go)."""
        self._consume_up_to(last_offset)
        if not transactional:
            return False
        entry = self._aborted.get(producer_id)
        if entry is not None:
            entry[1][:] = [last_offset]
            return True
        self._committed.add(producer_id)
        return False


def collect_aborted(per_segment: Sequence[tuple[int, Sequence[AbortedTxn]]], start: int,
                    upper: int) -> list[AbortedTxn]:
    """Kafka's collectAbortedTransactions(start, upper) over the txn indexes of segments (start offset, entries),
    in order: from the segment holding `start` on, the entries with last offset ≥ start and first offset < upper,
    until a segment names one whose last stable offset is at or past `upper` (the search is then complete)."""
    floor = 0
    for i, (seg_start, _) in enumerate(per_segment):
        if seg_start <= start:
            floor = i
    out: list[AbortedTxn] = []
    for _, entries in per_segment[floor:]:
        for t in entries:
            if t.last_offset >= start and t.first_offset < upper:
                out.append(t)
            if t.last_stable_offset >= upper:
                return out
    return out
