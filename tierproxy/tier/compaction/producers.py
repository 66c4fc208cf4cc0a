"""Each active producer's last batch (Kafka's UnifiedLog.lastRecordsOfActiveProducers), which a cleaning keeps —
empty if all its records go — so idempotent and transactional producer state survives the cleaning."""

from __future__ import annotations

from dataclasses import dataclass

from protocol.records import CONTROL_BIT, TRANSACTIONAL_BIT, BatchHeader


@dataclass(slots=True)
class ProducerState:
    last_data_offset: int = -1  # the last offset of its last data batch, -1: none
    epoch: int = -1
    last_timestamp: int = -1
    txn_open: bool = False
    txn_first: int = -1  # the first offset of its open transaction, -1: none


class ProducerTracker:
    """Fed every batch header of the partition's tier in offset order."""

    def __init__(self) -> None:
        self.states: dict[int, ProducerState] = {}

    def add(self, h: BatchHeader) -> None:
        if h.producer_id < 0:
            return
        st = self.states.get(h.producer_id)
        if st is None:
            st = self.states[h.producer_id] = ProducerState()
        if h.producer_epoch != st.epoch:  # Kafka's maybeUpdateProducerEpoch: a new epoch forgets the data batches
            st.epoch, st.last_data_offset = h.producer_epoch, -1
        st.last_timestamp = h.max_timestamp
        if h.attributes & CONTROL_BIT:
            st.txn_open, st.txn_first = False, -1
        else:
            st.last_data_offset = h.base_offset + h.last_offset_delta
            if h.attributes & TRANSACTIONAL_BIT and not st.txn_open:
                st.txn_open, st.txn_first = True, h.base_offset

    def first_undecided(self) -> int | None:
        """The first offset of the earliest transaction still open at the end of what was fed (no marker yet),
        or None: the tier's own last stable offset."""
        return min((st.txn_first for st in self.states.values() if st.txn_open), default=None)

    def active(self, now_ms: int, expiration_ms: int) -> dict[int, ProducerState]:
        """The producers Kafka would still hold: not idle for producer.id.expiration.ms, or in a transaction."""
        return {pid: st for pid, st in self.states.items()
                if st.txn_open or now_ms - st.last_timestamp < expiration_ms}


def is_last_of_producer(active: dict[int, ProducerState], h: BatchHeader) -> bool:
    """Kafka's isBatchLastRecordOfProducer: the batch holding the producer's last data offset, or — a producer
    with no data batch — its marker of the current epoch."""
    st = active.get(h.producer_id)
    if st is None:
        return False
    if st.last_data_offset >= 0:
        return h.base_offset + h.last_offset_delta == st.last_data_offset
    return bool(h.attributes & CONTROL_BIT) and h.producer_epoch == st.epoch
