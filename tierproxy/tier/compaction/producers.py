"""Each active producer's last batch (Kafka's UnifiedLog.lastRecordsOfActiveProducers), which a cleaning keeps —
empty if all its records go — so idempotent and transactional producer state survives the cleaning.

The tier holds a compacted topic's history for good and every producer instance has its own id, so the tracker
forgets producers as it reads, in the log's own time, as the broker does (ProducerStateManager.isProducerExpired):
when fed a batch, a producer with no open transaction whose last timestamp is producer.id.expiration.ms or more
older than `min(newest timestamp fed so far, now)` is expired (a future timestamp never expires one early). Its
state is then dropped by a sweep run each time the state count doubles (amortised O(1) a batch; at most twice the
states live at the last sweep, at least `_SWEEP_FLOOR`), and if it is fed again it starts afresh, as Kafka makes a
new entry (ProducerStateEntry.empty) for a producer it expired — whether or not a sweep dropped it yet, so the
outcome never depends on when sweeps run. Against a tracker that forgets nobody:
- a producer never fed again is expired at `now` too (its last timestamp is older than `now` - expiration): not
  active in either, so the same batches are kept;
- one fed again with a data batch ends with the same state (the batch sets epoch, last data offset, timestamp and
  transaction; nothing was open before);
- one fed again with markers alone (a transaction that added the partition and wrote nothing to it) holds no data
  batch, so its markers of that epoch are its last batch, as in Kafka, where the unbounded tracker kept its data
  batch from before it expired. This is the one difference, and it is Kafka's.
A producer in an open transaction is never expired, so `first_undecided` is unchanged. Records are decided by the
key map, aborted transactions and delete horizons, never by this tracker: it only chooses which batches are kept
empty (a producer's last) rather than dropped once all their records went."""

from __future__ import annotations

from dataclasses import dataclass

from protocol.records import CONTROL_BIT, TRANSACTIONAL_BIT, BatchHeader

_SWEEP_FLOOR = 1024  # states held before the first sweep (a few hundred KB)


@dataclass(slots=True)
class ProducerState:
    last_data_offset: int = -1  # the last offset of its last data batch, -1: none
    epoch: int = -1
    last_timestamp: int = -1
    txn_open: bool = False
    txn_first: int = -1  # the first offset of its open transaction, -1: none


class ProducerTracker:
    """Fed every batch header of the partition's tier in offset order; `now_ms` is the cleaning's time and
    `expiration_ms` producer.id.expiration.ms."""

    def __init__(self, now_ms: int, expiration_ms: int) -> None:
        self.now_ms, self.expiration_ms = now_ms, expiration_ms
        self.states: dict[int, ProducerState] = {}
        self._newest: int | None = None  # the newest timestamp fed so far
        self._sweep_at = _SWEEP_FLOOR

    def _expired(self, st: ProducerState, at_ms: int) -> bool:
        return not st.txn_open and at_ms - st.last_timestamp >= self.expiration_ms

    def add(self, h: BatchHeader) -> None:
        if self._newest is None or h.max_timestamp > self._newest:
            self._newest = h.max_timestamp
        if h.producer_id < 0:
            return
        st = self.states.get(h.producer_id)
        if st is None or self._expired(st, min(self._newest, self.now_ms)):  # expired: Kafka's entry is new
            if st is None and len(self.states) >= self._sweep_at:
                self._sweep(min(self._newest, self.now_ms))
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

    def _sweep(self, at_ms: int) -> None:
        self.states = {pid: st for pid, st in self.states.items() if not self._expired(st, at_ms)}
        self._sweep_at = max(_SWEEP_FLOOR, 2 * len(self.states))

    def first_undecided(self) -> int | None:
        """The first offset of the earliest transaction still open at the end of what was fed (no marker yet),
        or None: the tier's own last stable offset."""
        return min((st.txn_first for st in self.states.values() if st.txn_open), default=None)

    def active(self) -> dict[int, ProducerState]:
        """The producers Kafka would still hold at `now_ms`: not idle for producer.id.expiration.ms, or in a
        transaction."""
        return {pid: st for pid, st in self.states.items() if not self._expired(st, self.now_ms)}


def is_last_of_producer(active: dict[int, ProducerState], h: BatchHeader) -> bool:
    """Kafka's isBatchLastRecordOfProducer: the batch holding the producer's last data offset, or — a producer
    with no data batch — its marker of the current epoch."""
    st = active.get(h.producer_id)
    if st is None:
        return False
    if st.last_data_offset >= 0:
        return h.base_offset + h.last_offset_delta == st.last_data_offset
    return bool(h.attributes & CONTROL_BIT) and h.producer_epoch == st.epoch
