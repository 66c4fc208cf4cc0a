"""Which producers' last batches a tier cleaning keeps (Kafka's lastRecordsOfActiveProducers): a producer idle
producer.id.expiration.ms at the cleaning's time is not active, one inside the window is, one in an open
transaction always is; a producer the broker would have expired and that comes back with a marker alone is a fresh
producer, as Kafka makes it. And the engine's producer state stays bounded by the producers active within one
window, whatever the history's producer churn, giving what a tracker that forgets no producer gives."""

from __future__ import annotations

import dataclasses

import pytest

import tierproxy.tier.compaction.clean as clean_module
from protocol.records import ABORT, COMMIT, CONTROL_BIT, TRANSACTIONAL_BIT, BatchHeader
from tests.support.compaction import PLAIN, History, Tier, latest_values
from tierproxy.jobs.tiering.compaction_kernel import CompiledKernel
from tierproxy.tier.compaction import CleanerConfig
from tierproxy.tier.compaction.kernel import PYTHON, RecordKernel
from tierproxy.tier.compaction.producers import ProducerState, ProducerTracker

NOW = 10_000_000
EXP = 1_000  # producer.id.expiration.ms
TXN = 200
CONFIG = CleanerConfig(producer_id_expiration_ms=EXP, delete_retention_ms=100, min_cleanable_dirty_ratio=0.0)
KERNELS = pytest.mark.parametrize("kernel", [PYTHON, CompiledKernel()], ids=["python", "compiled"])


@KERNELS
def test_a_producer_idle_for_the_expiration_is_not_kept_one_inside_it_is_kept_empty(kernel: RecordKernel) -> None:
    tier, h = Tier(CONFIG, kernel=kernel), History()
    last_write = {101: NOW - 2 * EXP, 102: NOW - EXP, 103: NOW - EXP + 1, 104: NOW - 10}
    tier.append([h.data(pid, [(i, True)], ts) for i, (pid, ts) in enumerate(last_write.items())])
    tier.append([h.data(PLAIN, [(i, True) for i in range(4)], NOW - 5), h.data(PLAIN, [(5, True)], NOW - 5)])
    tier.clean(NOW)
    # idle >= producer.id.expiration.ms (Kafka's isProducerExpired): gone with its records; inside: kept empty
    assert {b.pid: b.records for b in tier.batches() if b.pid >= 0} == {103: (), 104: ()}


@KERNELS
def test_a_producer_in_an_open_transaction_is_kept_however_long_idle(kernel: RecordKernel) -> None:
    # The tier holds a transaction's data but not yet its marker, written long ago; thousands of producers come
    # and go after it (the tracker forgets the idle ones as it reads). The transaction is never forgotten: the
    # cleaning stops before it (first_undecided), so its value shadows nothing once the abort arrives.
    tier, h = Tier(CONFIG, kernel=kernel), History()
    old = NOW - 100 * EXP
    tier.append([h.data(PLAIN, [(0, True)], old), h.data(TXN, [(0, True)], old, txn=True)])
    committed = latest_values(tier.batches()[:1])[b"k0"]
    tier.append([h.data(1_000 + i, [(1 + i % 5, True)], old + 40 * i) for i in range(3_000)])
    tier.clean(NOW)
    assert [len(b.records) for b in tier.batches() if b.pid == TXN] == [1]
    tier.append([h.marker(TXN, ABORT, NOW), h.data(PLAIN, [(1, True)], NOW)])
    tier.clean(NOW + 1)
    assert latest_values(tier.batches())[b"k0"] == committed
    assert not any(b.pid == TXN and b.control is None and b.records for b in tier.batches())


@KERNELS
def test_a_producer_back_after_expiring_with_a_marker_alone_keeps_the_marker_as_kafka_does(
        kernel: RecordKernel) -> None:
    # Kafka forgets a producer idle producer.id.expiration.ms; a marker for it later (a transaction that added the
    # partition and wrote nothing to it) makes a fresh entry holding no data batch (ProducerStateEntry.empty), so
    # the cleaner keeps the producer's markers of that epoch, not its data batch from before it expired.
    tier, h = Tier(CONFIG, kernel=kernel), History()
    early, late = NOW - 10 * EXP, NOW - 100
    tier.append([h.data(TXN, [(0, True)], early, txn=True), h.marker(TXN, COMMIT, early),
                 h.data(PLAIN, [(1, True)], late), h.marker(TXN, COMMIT, late), h.data(PLAIN, [(0, True)], late)])
    tier.clean(NOW)
    for later in (200, 400):  # the markers' delete horizons pass: they are kept, empty, as the producer's last
        tier.append([h.data(PLAIN, [(2, True)], NOW + later)])
        tier.clean(NOW + later)
    assert [(b.base, b.control) for b in tier.batches() if b.pid == TXN] == [(1, -1), (3, -1)]


@KERNELS
def test_a_timestamp_past_the_cleanings_time_expires_nobody_early(kernel: RecordKernel) -> None:
    # A batch stamped far past the cleaning's clock (a producer's skewed CreateTime) is no measure of the log's
    # time: producers active at the cleaning's time stay so, also through the sweeps the churn after it runs.
    tier, h = Tier(CONFIG, kernel=kernel), History()
    tier.append([h.data(101, [(0, True)], NOW - 10), h.data(PLAIN, [(1, True)], NOW + 100 * EXP)]
                + [h.data(1_000 + i, [(1, True)], NOW - 5) for i in range(1_100)]  # new ids: the tracker sweeps
                + [h.data(PLAIN, [(0, True)], NOW - 5)])
    tier.clean(NOW)
    assert [b.records for b in tier.batches() if b.pid == 101] == [()]  # its last batch, kept empty


@KERNELS
def test_a_sweep_forgets_only_producers_expired_in_the_logs_time(kernel: RecordKernel) -> None:
    # A transactional producer writes, is idle 1.5 expirations by the cleaning's clock but only 0.1 by the log's
    # when churn makes the tracker sweep, and commits an empty transaction 0.5 after its data. Kafka never expired
    # it (idle 501 ms < producer.id.expiration.ms), so its entry's last data offset is still that batch, which the
    # cleaner keeps, empty. A sweep by the cleaning's clock would make the marker a fresh producer's last batch.
    tier, h = Tier(CONFIG, kernel=kernel), History()
    t0 = NOW - 3 * EXP // 2
    tier.append([h.data(TXN, [(0, True)], t0, txn=True), h.marker(TXN, COMMIT, t0)]
                + [h.data(1_000 + i, [(1, True)], t0 + 100) for i in range(1_100)]  # new ids: the tracker sweeps
                + [h.marker(TXN, COMMIT, t0 + 501), h.data(PLAIN, [(0, True)], t0 + 501)])
    tier.clean(NOW)
    assert [(b.base, b.records) for b in tier.batches() if b.pid == TXN and b.control is None] == [(0, ())]


class UnboundedTracker(ProducerTracker):
    """The rule before producer state was bounded (a copy): every producer ever fed is held, and is active at the
    end when not idle for the expiration at `now` or in a transaction."""

    def __init__(self, now_ms: int, expiration_ms: int) -> None:
        super().__init__(now_ms, expiration_ms)
        self.held: dict[int, ProducerState] = {}

    def add(self, h: BatchHeader) -> None:
        if h.producer_id < 0:
            return
        st = self.held.setdefault(h.producer_id, ProducerState())
        if h.producer_epoch != st.epoch:
            st.epoch, st.last_data_offset = h.producer_epoch, -1
        st.last_timestamp = h.max_timestamp
        if h.attributes & CONTROL_BIT:
            st.txn_open, st.txn_first = False, -1
        else:
            st.last_data_offset = h.base_offset + h.last_offset_delta
            if h.attributes & TRANSACTIONAL_BIT and not st.txn_open:
                st.txn_open, st.txn_first = True, h.base_offset

    def first_undecided(self) -> int | None:
        return min((st.txn_first for st in self.held.values() if st.txn_open), default=None)

    def active(self) -> dict[int, ProducerState]:
        return {pid: st for pid, st in self.held.items()
                if st.txn_open or self.now_ms - st.last_timestamp < self.expiration_ms}


class Watched(ProducerTracker):
    """The engine's tracker, its largest state count recorded."""

    peak = 0

    def add(self, h: BatchHeader) -> None:
        super().add(h)
        Watched.peak = max(Watched.peak, len(self.states))


def test_producer_churn_keeps_the_state_to_the_producers_active_in_a_window(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A long-lived changelog written by 20,000 short-lived producers (each its own producer id), one batch each,
    # over 25 expiration windows; every 100th comes back with data 5 windows later. The state held stays within
    # twice the producers active in one window (800 and their returns), not the history's 20,000.
    step, n = 10, 20_000
    exp = n * step // 25
    config = dataclasses.replace(CONFIG, producer_id_expiration_ms=exp)
    writes = sorted([(i * step, i) for i in range(n)]
                    + [(i * step + 5 * exp, i) for i in range(0, n - 5 * exp // step, 100)])
    tier, h = Tier(config), History([b"key-%d" % i for i in range(500)])
    raw = [h.data(pid, [(pid % 500, True)], ts) for ts, pid in writes]
    for i in range(0, len(raw), 2_000):
        tier.append(raw[i:i + 2_000])
    unbounded = Tier(config)
    unbounded.segments = list(tier.segments)
    now, window = n * step, exp // step
    Watched.peak = 0
    monkeypatch.setattr(clean_module, "ProducerTracker", Watched)
    out = tier.clean(now)
    assert window <= Watched.peak <= 2 * (window + window // 50), Watched.peak
    monkeypatch.setattr(clean_module, "ProducerTracker", UnboundedTracker)
    assert out == unbounded.clean(now)
    assert tier.log() == unbounded.log()
    last_write = {pid: ts for ts, pid in writes}
    active = sorted(pid for pid, ts in last_write.items() if now - ts < exp)  # each one's last batch, kept
    assert sorted(b.pid for b in tier.batches() if b.pid >= 0) == active
