"""LogCleaner parity for a fenced transactional producer: its open transaction is aborted by the coordinator
with a marker of a new producer epoch, so Kafka's producer state holds no data batch for it — the broker's
cleaner keeps the marker for the producer and removes the aborted batch whole; the engine must do the same."""

from __future__ import annotations

import pytest
from confluent_kafka import Producer

from protocol.records import CONTROL_BIT, iter_batches
from tests.support.compaction import Tier
from tests.support.fetchraw import fetch_raw
from tests.support.kafka import create_topic, set_topic_config, small_segments
from tests.tier.test_compaction_parity import RETENTION, _cleaned_by_broker, _segments
from tierproxy.dev.kafkadist import KafkaCluster
from tierproxy.tier.compaction import CleanerConfig

pytestmark = pytest.mark.kafka


def _produce(bootstrap: str, topic: str) -> None:
    plain = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "enable.idempotence": False})
    plain.produce(topic, b"kept", b"key-1")
    plain.produce(topic, None, b"key-2")  # a tombstone: its delete horizon tells the broker's cleaning time
    plain.flush(10)
    zombie = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"fenced-{topic}"})
    zombie.init_transactions(30)
    zombie.begin_transaction()
    zombie.produce(topic, b"aborted by the fence", b"key-1")
    zombie.flush(10)
    # a new instance of the same transactional id: the coordinator aborts the zombie's transaction, new epoch
    Producer({"bootstrap.servers": bootstrap, "transactional.id": f"fenced-{topic}"}).init_transactions(30)
    for i in range(80):  # fills the segment so the above leaves the active segment
        plain.produce(topic, b"f" * 300, b"filler-%d" % i)
        if i % 10 == 9:
            plain.flush(10)


def test_a_fenced_producers_marker_is_what_both_cleaners_keep(kafka: KafkaCluster, topic_name: str) -> None:
    create_topic(kafka.bootstrap, topic_name, config=small_segments(16 * 1024))
    _produce(kafka.bootstrap, topic_name)
    raw, _ = fetch_raw(kafka.bootstrap, topic_name)
    txn = [b.header() for b in iter_batches(raw) if b.producer_id >= 0]
    data, marker = [h for h in txn if not h.attributes & CONTROL_BIT], [h for h in txn if h.attributes & CONTROL_BIT]
    assert len(data) == 1 and len(marker) == 1 and marker[0].producer_epoch > data[0].producer_epoch
    for key, value in (("delete.retention.ms", str(RETENTION)), ("min.cleanable.dirty.ratio", "1.0"),
                       ("cleanup.policy", "compact")):
        set_topic_config(kafka.bootstrap, topic_name, key, value)
    active_base, broker_batches, now = _cleaned_by_broker(kafka, topic_name, 0)

    tier = Tier(CleanerConfig(delete_retention_ms=RETENTION, min_cleanable_dirty_ratio=0.01))
    for seg in _segments(raw, active_base):
        tier.append([bytes(b.view()) for b in iter_batches(seg)])
    assert tier.clean(now, last_stable_offset=active_base)
    assert [b.base for b in broker_batches if b.pid >= 0] == [marker[0].base_offset]  # the data batch went
    assert tier.batches() == broker_batches
