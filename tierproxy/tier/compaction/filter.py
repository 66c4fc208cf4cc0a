"""One batch through the cleaner's filter (Kafka's Cleaner.cleanInto RecordFilter and MemoryRecords.filterTo):
kept whole as its exact bytes, rebuilt with the records kept, kept empty, or dropped."""

from __future__ import annotations

from dataclasses import dataclass

from protocol.records import (
    CONTROL_BIT,
    CONTROL_KEY,
    DELETE_HORIZON_BIT,
    TRANSACTIONAL_BIT,
    BatchHeader,
    RecordBatch,
    build_empty_batch,
    rebuild_batch,
    scan_records,
)
from tierproxy.tier.compaction.kernel import PYTHON, RecordKernel
from tierproxy.tier.compaction.model import MAX_LONG
from tierproxy.tier.compaction.offset_map import OffsetMap
from tierproxy.tier.compaction.producers import ProducerState, is_last_of_producer
from tierproxy.tier.compaction.txn import CleanedTransactions


@dataclass
class RecordFilter:
    """The filter of one cleaning: its time, key map, transactions, active producers and round end."""

    now_ms: int
    delete_retention_ms: int
    offsets: OffsetMap
    txns: CleanedTransactions
    producers: dict[int, ProducerState]
    upper: int  # the first uncleanable offset: the batch ending just before it is kept, even empty
    records_read: int = 0
    kernel: RecordKernel = PYTHON  # the per-record loops (compiled when the job has numba)

    def apply(self, batch: RecordBatch) -> bytes | memoryview | None:
        """The batch as the cleaned log holds it: the source view (kept whole), new bytes, or None (gone)."""
        h = batch.header()
        if h.magic != 2:
            raise ValueError(f"batch at {h.base_offset} has magic {h.magic}: only v2 batches are cleaned")
        last = h.base_offset + h.last_offset_delta
        control = bool(h.attributes & CONTROL_BIT)
        has_horizon = bool(h.attributes & DELETE_HORIZON_BIT)
        if control:
            section, spans = scan_records(batch)
            self.records_read += len(spans)
            ctype = CONTROL_KEY.unpack_from(section, spans[0][2])[1] if spans and spans[0][3] >= 4 else None
            can_discard = self.txns.on_control_batch(batch, ctype)
            discard_records = can_discard and has_horizon and h.base_timestamp <= self.now_ms
        else:
            retained = self.kernel.retain(batch, h, self.offsets, self.now_ms)  # a corrupt batch raises, kept or not
            self.records_read += retained.total
            can_discard = self.txns.on_data_batch(bool(h.attributes & TRANSACTIONAL_BIT), h.producer_id, last)
            discard_records = can_discard
        # kept even empty: a producer's last batch (its state), the round's last batch (the log's last offset)
        retain_empty = (h.producer_id >= 0 and is_last_of_producer(self.producers, h)) or last + 1 == self.upper
        if discard_records and not retain_empty:
            return None
        marker_for_empty_txn = can_discard and control
        if discard_records:
            kept, total = 0, 0
        elif control:
            kept = total = len(spans)
        else:
            kept, total = retained.kept, retained.total
        if kept:
            tombstones = retained.tombstones if not control else False
            need_horizon = (tombstones or marker_for_empty_txn) and not has_horizon
            if kept == total and not need_horizon:
                return batch.view()
            horizon = self.now_ms + self.delete_retention_ms if need_horizon else \
                (h.base_timestamp if has_horizon else -1)
            if horizon > MAX_LONG:  # Kafka's sum wraps negative: no horizon, the tombstones stay
                horizon = -1
            if control:
                return rebuild_batch(h, section, spans, delete_horizon_ms=horizon)
            return self.kernel.rebuild(h, retained, horizon)
        if retain_empty:
            return _empty(h)
        return None


def _empty(h: BatchHeader) -> bytes:
    return build_empty_batch(h.base_offset, h.base_offset + h.last_offset_delta,
                             partition_leader_epoch=h.partition_leader_epoch, producer_id=h.producer_id,
                             producer_epoch=h.producer_epoch, base_sequence=h.base_sequence,
                             max_timestamp=h.max_timestamp, attributes=h.attributes)
