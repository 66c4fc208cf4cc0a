"""Edge cases of the tier's compaction engine where Kafka's cleaner keeps a record: a transaction whose marker
the tier does not hold yet, a delete.retention.ms past the end of a long, a map whose batch repeats keys."""

from __future__ import annotations

from protocol.records import ABORT, build_control_batch
from tests.support.compaction import PLAIN, History, Tier, decode, latest_values
from tierproxy.tier.compaction import BYTES_PER_ENTRY, CleanerConfig

NOW = 10_000
TXN = 200


def test_a_transaction_whose_marker_the_tier_does_not_hold_yet_shadows_nothing() -> None:
    # The broker closes a segment inside a transaction that it later aborts: the tier copies the segment (the
    # marker is in the broker's next, still active, segment) and cleans it before the marker arrives. Kafka's
    # cleaner never maps an undecided transaction (it stops at the LSO); the tier must not either, or the aborted
    # value evicts the key's committed one and the key is gone once the abort is known.
    tier, h = Tier(CleanerConfig(delete_retention_ms=1_000, min_cleanable_dirty_ratio=0.0)), History()
    tier.append([h.data(PLAIN, [(0, True), (1, True)], NOW - 100),
                 h.data(TXN, [(0, True)], NOW - 100, txn=True),
                 h.data(PLAIN, [(2, True)], NOW - 100)])
    committed = latest_values(tier.batches()[:1])[b"k0"]
    tier.clean(NOW)
    tier.append([h.data(PLAIN, [(3, True)], NOW - 50), h.marker(TXN, ABORT, NOW - 50),
                 h.data(PLAIN, [(4, True)], NOW - 50)])
    tier.clean(NOW)
    assert not any(b.txn and b.records and b.control is None for b in tier.batches())  # the abort is applied
    assert latest_values(tier.batches()).get(b"k0") == committed


def test_a_delete_retention_past_the_end_of_a_long_keeps_tombstones_as_kafka_does() -> None:
    # delete.retention.ms may be Long.MAX_VALUE ("keep tombstones"): Kafka's now + retention wraps negative, so the
    # batch gets no delete horizon and its tombstones stay; the engine must clean, not fail on every pass
    config = CleanerConfig.from_topic_configs({"delete.retention.ms": str(2**63 - 1),
                                               "min.cleanable.dirty.ratio": "0"})
    tier, h = Tier(config), History()
    tier.append([h.data(PLAIN, [(0, True), (1, True)], NOW - 100), h.data(PLAIN, [(0, False)], NOW - 100)])
    tier.clean(NOW)
    tier.append([h.data(PLAIN, [(2, True)], NOW - 50)])
    tier.clean(NOW + 10**12)
    assert latest_values(tier.batches())[b"k0"] == (2, None)
    assert all(b.horizon is None for b in tier.batches())


def test_a_marker_that_bumps_the_epoch_is_the_producers_last_batch_as_in_kafka() -> None:
    # The coordinator aborts a timed-out (or fenced) transaction with a marker of a new epoch (and, with
    # transaction.version 2, ends every transaction so). Kafka's producer state then holds no data batch for the
    # producer (ProducerStateEntry.maybeUpdateProducerEpoch clears it): the marker is what the cleaner keeps for
    # the producer's epoch, and the aborted data batch goes whole.
    tier, h = Tier(CleanerConfig(delete_retention_ms=1_000, min_cleanable_dirty_ratio=0.0)), History()
    plain, data = h.data(PLAIN, [(1, True)], NOW - 100), h.data(TXN, [(0, True)], NOW - 100, txn=True)
    marker = build_control_batch(ABORT, offset=h.next, producer_id=TXN, producer_epoch=1, timestamp=NOW - 100)
    h.next += 1
    tier.append([plain, data, marker, h.data(PLAIN, [(2, True)], NOW - 100)])
    tier.clean(NOW)
    assert [(b.base, b.control) for b in tier.batches() if b.pid == TXN] == [(2, ABORT)]
    for later in (2_000, 4_000):  # the marker gets its delete horizon, which then passes: it is kept, empty
        tier.append([h.data(PLAIN, [(3, True)], NOW + later)])
        tier.clean(NOW + later)
    assert [(b.base, b.control, b.records) for b in tier.batches() if b.pid == TXN] == [(2, -1, ())]


def test_a_group_the_map_ends_inside_is_replaced_whole() -> None:
    # The map fills in the first of a group's segments: the new segments still cover the group's whole range (the
    # interface's contract: the tier job replaces the group or nothing), the covered piece cleaned and the rest —
    # the segments wholly past the map as they were — left dirty for the next cleaning.
    keys = [b"key-%03d" % i for i in range(40)]
    tier, h = Tier(CleanerConfig(min_cleanable_dirty_ratio=0.0)), History(keys)
    for seg in range(3):
        tier.append([h.data(PLAIN, [(k, True)], NOW - 100) for k in range(seg * 10, seg * 10 + 20)])
    before = [(s.start_offset, s.end_offset) for s, _ in tier.segments]
    raw = {(s.start_offset, s.end_offset): bytes(i.log) for s, i in tier.segments}
    out = tier.clean(NOW, map_bytes=BYTES_PER_ENTRY * 12)  # 10 keys: the map fills in the first segment
    assert out and len(out) == 2
    assert (out[0].start_offset, out[-1].end_offset) == (before[0][0], before[-1][1])
    assert out[0].cleaned and not out[1].cleaned and out[1].start_offset == out[0].end_offset + 1
    assert len(out[0].replaces) == 3
    # the segments past the map's end are carried as they were, byte for byte
    rest = tier.segments[-1][1].log
    assert bytes(rest).endswith(raw[before[1]] + raw[before[2]])
    assert latest_values(tier.batches()) == latest_values(decode(b"".join(raw.values())))
