"""A compacted topic the session broker's cleaner has cleaned: made, waited for, and read back (from the broker,
from the tier, through a proxy) as comparable lists of records."""

from __future__ import annotations

import time
import uuid

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from protocol.constants import IsolationLevel
from protocol.records import RecordBatch, iter_batches
from tests.support.kafka import create_topic, set_topic_config, small_segment_producer, small_segments, watermarks
from tests.support.waiting import wait_until
from tierproxy.dev.kafkadist import KafkaCluster
from tierproxy.jobs.spark.rows import visible_batches
from tierproxy.jobs.tiering.copy import iter_fetch

Rec = tuple[int, bytes | None, bytes | None]  # offset, key, value
# the broker cleans as soon as a closed segment holds any dirt (`log.cleaner.backoff.ms` is 500 ms on the suite's
# brokers: `kafkadist`), and keeps tombstones a day (delete.retention.ms, Kafka's default)
COMPACTED = {"min.cleanable.dirty.ratio": "0.01", "min.compaction.lag.ms": "0", "retention.ms": "3600000"}


def create_compacted(bootstrap: str, topic: str, policy: str = "compact,delete", partitions: int = 1,
                     replication: int = 1) -> None:
    create_topic(bootstrap, topic, partitions=partitions, replication=replication,
                 config={**small_segments(16 * 1024), **COMPACTED, "cleanup.policy": policy})


def produce_updates(bootstrap: str, topic: str, n: int = 3000, keys: int = 60, ts0: int | None = None,
                    partition: int = 0) -> int:
    """`n` updates of `keys` keys (every 13th a tombstone; timestamps `ts0` + 10 ms per record), then a committed
    and an aborted transaction of keyed records, then 50 more updates; → the number of offsets written."""
    ts0 = int(time.time() * 1000) - 60_000 if ts0 is None else ts0
    p = small_segment_producer(bootstrap)
    for i in range(n):
        value = None if i % 13 == 5 else f"v{i}-{'x' * 40}".encode()
        p.produce(topic, value, f"key-{i % keys}".encode(), partition=partition, timestamp=ts0 + 10 * i)
    p.flush(60)
    tx = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"tx-{uuid.uuid4().hex[:8]}"})
    tx.init_transactions(30)
    for commit in (True, False):
        tx.begin_transaction()
        for j in range(20):
            tx.produce(topic, f"{'committed' if commit else 'aborted'}-{j}".encode(), f"key-{j}".encode(),
                       partition=partition, timestamp=ts0 + 10 * n)
        tx.flush(30)
        tx.commit_transaction(30) if commit else tx.abort_transaction(30)
    for i in range(n, n + 50):
        p.produce(topic, f"v{i}-late".encode(), f"key-{i % keys}".encode(), partition=partition,
                  timestamp=ts0 + 10 * (i + 2))
    p.flush(60)
    return watermarks(bootstrap, topic, partition)[1]


def raw_batches(bootstrap: str, topic: str, partition: int = 0) -> list[RecordBatch]:
    """Every batch the broker holds (read_uncommitted, up to its high watermark)."""
    lo, hi = watermarks(bootstrap, topic, partition)
    return [b for got, _ in iter_fetch(bootstrap, topic, partition, lo, hi,
                                       isolation=IsolationLevel.READ_UNCOMMITTED, client_id="tests") for b in got]


def wait_cleaned(bootstrap: str, topic: str, written: int, partition: int = 0) -> int:
    """Until the broker's cleaner has removed most of the records written (whole batches and records inside
    batches): → the records left."""
    def left() -> int | None:
        n = sum(b.records_count for b in raw_batches(bootstrap, topic, partition))
        return n if n < written // 3 else None

    return wait_until(left, f"the broker's cleaner compacts {topic}", timeout=90, interval=0.5)


def records_of(raw: bytes, aborted: list[tuple[int, int]], read_committed: bool = True) -> list[Rec]:
    """The data records of whole batches `raw` a consumer sees (`aborted`: producer id, first offset)."""
    return [(r.offset, r.key, r.value) for b in visible_batches(iter_batches(raw), read_committed, list(aborted))
            for r in b.records()]


def consume(bootstrap: str, topic: str, until: int, partition: int = 0, isolation: str = "read_committed",
            timeout: float = 60) -> list[Rec]:
    """Every record confluent-kafka delivers from offset 0 (assigned, no reset) until a record at or past `until`,
    the end of the partition, or its position past `until` - 1 (the last offsets may be markers)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"read-{uuid.uuid4().hex[:6]}",
                  "auto.offset.reset": "error", "isolation.level": isolation, "enable.auto.commit": False,
                  "enable.partition.eof": True})
    c.assign([TopicPartition(topic, partition, 0)])
    got: list[Rec] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            msgs = c.consume(500, 0.3)
            for m in msgs:
                if m.error() is not None:
                    assert m.error().code() == KafkaError._PARTITION_EOF, f"the consumer met {m.error()}"
                    return got
                if m.offset() >= until:
                    return got
                got.append((m.offset(), m.key(), m.value()))
            if not msgs and c.position([TopicPartition(topic, partition)])[0].offset >= until:
                return got
    finally:
        c.close()
    raise AssertionError(f"read {len(got)} records of {topic} in {timeout:.0f}s, not up to {until}")


def latest(records: list[Rec]) -> dict[bytes | None, bytes]:
    """Each key's latest value (a tombstone removes it): what a compacted topic read from its start gives."""
    out: dict[bytes | None, bytes] = {}
    for _, k, v in records:
        if v is None:
            out.pop(k, None)
        else:
            out[k] = v
    return out


def roll(kafka: KafkaCluster, topic: str, end: int, partition: int = 0, timeout: float = 60) -> None:
    """Close the active segment holding offsets below `end`: `segment.ms` short meanwhile and ticks (key b"tick")
    appended until the broker's log dir has a segment starting at or past `end` (the tick that rolled it is its first
    record). Everything below `end` is then in closed segments: the cleaner may clean it, a tier pass copy it."""
    dirs = [node.workdir / "data" / f"{topic}-{partition}" for node in kafka.nodes]
    p = Producer({"bootstrap.servers": kafka.bootstrap})
    set_topic_config(kafka.bootstrap, topic, "segment.ms", "1000")

    def rolled() -> bool:
        p.produce(topic, b"tick", b"tick", partition=partition)
        p.flush(10)
        return any(int(f.stem) >= end for d in dirs if d.is_dir() for f in d.glob("*.log"))

    try:
        wait_until(rolled, f"{topic}-{partition}'s active segment rolled past {end}", timeout=timeout, interval=0.3)
    finally:
        set_topic_config(kafka.bootstrap, topic, "segment.ms", None)


def cleaned_to(kafka: KafkaCluster, topic: str, partition: int = 0) -> int:
    """How far the broker's cleaner has cleaned the partition (its cleaner-offset-checkpoint; 0: never)."""
    got = 0
    for node in kafka.nodes:
        checkpoint = node.workdir / "data" / "cleaner-offset-checkpoint"
        lines = checkpoint.read_text().splitlines()[2:] if checkpoint.exists() else []
        got = max([got, *(int(o) for t, p, o in (line.split() for line in lines) if (t, int(p)) == (topic, partition))])
    return got
