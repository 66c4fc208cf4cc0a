"""Indexes built from the real broker's batches: offset/time lookups, leader epochs, transactions with an
abort spanning a segment boundary, producer snapshots."""

from __future__ import annotations

import pytest
from confluent_kafka import Producer

from protocol.records import iter_batches
from tests.support.fetchraw import fetch_raw
from tests.support.kafka import create_topic
from tierproxy.dev.kafkadist import KafkaCluster
from tierproxy.tier.indexes import (
    SegmentBuilder,
    decode_leader_epochs,
    decode_producer_snapshot,
    decode_txn_index,
    lookup_position,
    lookup_time,
)

pytestmark = pytest.mark.kafka


def _produce_mixed(bootstrap: str, topic: str) -> None:
    plain = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    tx = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"tx-{topic}", "linger.ms": 0})
    tx.init_transactions(30)
    for round_ in range(3):
        tx.begin_transaction()
        for i in range(5):
            tx.produce(topic, f"tx{round_}-{i}".encode() * 50)
            tx.flush(10)
            plain.produce(topic, f"plain{round_}-{i}".encode() * 50)
            plain.flush(10)
        if round_ == 1:
            tx.abort_transaction(30)
        else:
            tx.commit_transaction(30)


def test_segments_from_real_batches(kafka: KafkaCluster, topic_name: str) -> None:
    create_topic(kafka.bootstrap, topic_name)
    _produce_mixed(kafka.bootstrap, topic_name)
    raw, _ = fetch_raw(kafka.bootstrap, topic_name)
    _, broker_aborted = fetch_raw(kafka.bootstrap, topic_name, isolation=1)
    batches = list(iter_batches(raw))
    assert any(b.is_control for b in batches)
    # cut inside the aborted transaction: after its first batch, before its marker
    aborted_first = broker_aborted[0]["first_offset"]
    cut = next(i for i, b in enumerate(batches) if b.base_offset > aborted_first) + 1
    first = SegmentBuilder(index_interval_bytes=256)
    for b in batches[:cut]:
        first.add(b)
    s1 = first.finish()
    second = SegmentBuilder(s1.producers, index_interval_bytes=256)
    for b in batches[cut:]:
        second.add(b)
    s2 = second.finish()

    assert s1.log + s2.log == raw  # byte for byte what the broker served
    assert s1.txn_index_empty and decode_txn_index(s1.txn_index) == []
    got = [(a.producer_id, a.first_offset) for a in decode_txn_index(s2.txn_index)]
    assert got == [(a["producer_id"], a["first_offset"]) for a in broker_aborted]
    open_txns = {p: e.current_txn_first_offset for p, e in decode_producer_snapshot(s1.producer_snapshot).items()
                 if e.current_txn_first_offset >= 0}
    assert open_txns == {broker_aborted[0]["producer_id"]: aborted_first}
    assert decode_leader_epochs(s1.leader_epoch_checkpoint) == {0: s1.start_offset}
    assert s2.start_offset == s1.end_offset + 1 and s2.end_offset == batches[-1].last_offset
    assert len(s1.offset_index) > 0 and len(s1.time_index) > 0

    for seg_files in (s1, s2):
        seg_batches = list(iter_batches(seg_files.log))
        for b in seg_batches:
            for offset in (b.base_offset, b.last_offset):
                pos = lookup_position(seg_files.offset_index, seg_files.start_offset, offset)
                containing = [x for x in iter_batches(seg_files.log[pos:]) if x.base_offset <= offset <= x.last_offset]
                assert containing, f"offset {offset} not reachable from position {pos}"
            floor = lookup_time(seg_files.time_index, seg_files.start_offset, b.max_timestamp)
            assert floor <= b.last_offset


def test_an_empty_abort_marker_does_not_reopen_an_older_aborted_transaction() -> None:
    from protocol.records import ABORT, Record, build_batch, build_control_batch
    from tierproxy.tier.indexes import build_segment

    pid = 7
    data = build_batch([Record(0, 1, None, b"a"), Record(1, 1, None, b"b")], producer_id=pid, producer_epoch=0,
                       base_sequence=0, transactional=True)
    marker = build_control_batch(ABORT, offset=2, producer_id=pid, producer_epoch=0, timestamp=2)
    empty_abort = build_control_batch(ABORT, offset=3, producer_id=pid, producer_epoch=1, timestamp=3)
    files = build_segment(data + marker + empty_abort, txn_starts=[(pid, 0)])
    got = [(a.producer_id, a.first_offset, a.last_offset) for a in decode_txn_index(files.txn_index)]
    assert got == [(pid, 0, 2)]
