"""Topic and offset helpers over the real broker (confluent-kafka's admin client, used only by tests)."""

from __future__ import annotations

import os
import time

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from protocol.constants import ApiKey
from protocol.requests import list_offsets_request
from tierproxy.kafka.wireclient import WireClient


def small_segments(segment_bytes: int = 16 * 1024, version: str = "4.1") -> dict[str, str]:
    """Topic configs for broker segments of `segment_bytes`: many segments from little data, with no wait for
    `segment.ms` to roll them. Kafka 4 refuses `segment.bytes` under 1 MiB; from 4.1 its `internal.segment.bytes`
    (the broker's own tests use it) takes any size; 4.0 has neither (1 MiB segments); Kafka 3 takes a small
    `segment.bytes` itself."""
    major, minor = (int(x) for x in version.split(".")[:2])
    if major < 4:
        return {"segment.bytes": str(segment_bytes)}
    if (major, minor) < (4, 1):
        return {"segment.bytes": str(max(segment_bytes, 1 << 20))}
    return {"internal.segment.bytes": str(segment_bytes)}


def small_segment_producer(bootstrap: str, **config: object) -> Producer:
    """A producer for topics of `small_segments`: batches of at most 8 KiB (a batch must fit in a segment, the
    broker refuses a bigger one), idempotent (a retried batch never lands after later ones: offsets stay in the
    order produced)."""
    return Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "batch.size": 8 * 1024,
                     "enable.idempotence": True, **config})


def create_topic(bootstrap: str, name: str, partitions: int = 1, replication: int = 1,
                 config: dict[str, str] | None = None, timeout: float = 30.0) -> None:
    """Create a topic with overrides (e.g. small segment.bytes, short retention.ms) and wait for leaders."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    fut = admin.create_topics([NewTopic(name, partitions, replication, config=config or {})],
                              operation_timeout=timeout)[name]
    fut.result(timeout)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        md = admin.list_topics(name, timeout=5).topics.get(name)
        if md is not None and md.error is None and len(md.partitions) == partitions and all(
                p.leader >= 0 for p in md.partitions.values()):
            return
        time.sleep(0.1)
    raise TimeoutError(f"topic {name} has no leaders after {timeout}s")


def watermarks(bootstrap: str, topic: str, partition: int = 0) -> tuple[int, int]:
    """(log start offset, high watermark) as the broker reports them now."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "tierproxy-watermarks"})
    try:
        for _ in range(20):
            try:
                lo, hi = c.get_watermark_offsets(TopicPartition(topic, partition), timeout=5, cached=False)
                return int(lo), int(hi)
            except KafkaException:
                time.sleep(0.2)
        raise TimeoutError(f"no watermarks for {topic}-{partition}")
    finally:
        c.close()


def set_retention(bootstrap: str, topic: str, retention_ms: int) -> None:
    """Shorten (or lengthen) a topic's retention.ms now (incremental AlterConfigs)."""
    set_topic_config(bootstrap, topic, "retention.ms", str(retention_ms))


def set_topic_config(bootstrap: str, topic: str, key: str, value: str | None) -> None:
    """Set one topic config now (incremental AlterConfigs); None removes the topic's own value."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

    admin = AdminClient({"bootstrap.servers": bootstrap})
    op = AlterConfigOpType.SET if value is not None else AlterConfigOpType.DELETE
    res = ConfigResource("topic", topic, incremental_configs=[ConfigEntry(key, value or "", incremental_operation=op)])
    for fut in admin.incremental_alter_configs([res]).values():
        fut.result(30)


def read_to_end(bootstrap: str, topic: str, isolation: str = "read_uncommitted", timeout: float = 60) -> list[str]:
    """Every value of a single-partition topic from the beginning to the end, as a fresh group sees it."""
    import uuid

    from confluent_kafka import KafkaError

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"read-{uuid.uuid4().hex[:6]}",
                  "auto.offset.reset": "earliest", "isolation.level": isolation, "enable.partition.eof": True})
    c.subscribe([topic])
    got: list[str] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            m = c.poll(0.3)
            if m is None:
                continue
            if m.error() is not None:
                if m.error().code() == KafkaError._PARTITION_EOF:
                    break
                continue
            got.append(m.value().decode())
    finally:
        c.close()
    return got


def broker_forgets(bootstrap: str, topic: str, *, above: int = 0, retention_ms: int = 1000,
                   restore_ms: int | None = 3_600_000, timeout: float = 60, interval: float = 0.3,
                   key: bytes | None = None) -> int:
    """Make the broker delete the start of a single-partition topic: shorten `retention.ms` and append ticks until
    its log start offset passes `above`. Then retention goes back to `restore_ms` (None: left short). Returns the
    new log start; fails if it never moved. The log keeps a tail: the newest ticks (with `key`: a compacted topic
    takes no record without one).

    Each tick refreshes the active segment's newest timestamp, so a segment that is still active never expires
    while ticks come: `segment.ms` is set to `retention_ms` meanwhile, so the next tick rolls the segment holding
    `above` (its first record is older than that) and retention deletes it once it is closed and expired; the
    topic's own `segment.ms` comes back after."""
    from confluent_kafka import Producer

    segment_ms = topic_config(bootstrap, topic, "segment.ms")
    set_topic_config(bootstrap, topic, "segment.ms", str(retention_ms))
    set_retention(bootstrap, topic, retention_ms)
    p = Producer({"bootstrap.servers": bootstrap})
    deadline = time.monotonic() + timeout
    try:
        while (start := watermarks(bootstrap, topic)[0]) <= above and time.monotonic() < deadline:
            p.produce(topic, b"tick", key)
            p.flush(5)
            time.sleep(interval)
    finally:
        set_topic_config(bootstrap, topic, "segment.ms", segment_ms)
    if restore_ms is not None:
        set_retention(bootstrap, topic, restore_ms)
        start, end = watermarks(bootstrap, topic)  # a deletion may have run meanwhile
        if start == end:  # it took the last tick too (the active segment expired): the log keeps a tail
            p.produce(topic, b"tick", key)
            assert p.flush(5) == 0
    assert start > above, f"the broker kept {topic} from offset {start} (wanted past {above}) for {timeout:.0f}s"
    return start


def topic_config(bootstrap: str, topic: str, key: str) -> str | None:
    """A topic's own value of `key` (None: not set on the topic, the broker's default applies)."""
    from confluent_kafka.admin import ConfigResource, ConfigSource

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for fut in admin.describe_configs([ConfigResource("topic", topic)], request_timeout=30).values():
        entry = fut.result(30).get(key)
        source = getattr(entry, "source", None)
        if entry is not None and getattr(source, "value", source) == ConfigSource.DYNAMIC_TOPIC_CONFIG.value:
            return str(entry.value)
    return None


def offsets_from_the_beginning(bootstrap: str, topic: str, end: int, timeout: float = 60) -> list[int]:
    """Offsets a new group with auto.offset.reset=earliest reads through `bootstrap` from its first position, until
    offset `end - 1` (or `timeout` seconds)."""
    import uuid

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"reader-{uuid.uuid4().hex[:8]}",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
    c.subscribe([topic])
    got: list[int] = []
    try:
        deadline = time.monotonic() + timeout
        while (not got or got[-1] < end - 1) and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and not m.error():
                got.append(m.offset())
    finally:
        c.close()
    return got


def delete_records(bootstrap: str, topic: str, offsets: dict[int, int]) -> dict[int, tuple[int, int]]:
    """partition → (error code, low watermark) of one DeleteRecords v2."""
    with WireClient(bootstrap, timeout=60) as w:
        resp = w.request(ApiKey.DELETE_RECORDS, 2, {"topics": [{"name": topic, "partitions": [
            {"partition_index": p, "offset": o} for p, o in offsets.items()]}], "timeout_ms": 30_000})
    return {p["partition_index"]: (p["error_code"], p["low_watermark"]) for t in resp["topics"]
            for p in t["partitions"]}


def fill_topic(bootstrap: str, topic: str, n: int) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "batch.size": 16384})  # tier segments are cut
    for i in range(n):                                                                   # between batches
        p.produce(topic, os.urandom(200), f"k{i}".encode())
    p.flush(60)


def list_offsets_at_leaders(bootstrap: str, spec: int, *, topic: str, quiet: bool = False, version: int = 7,
                            isolation: int = 0) -> dict[int, tuple[int, int]]:
    """partition → (offset, leader epoch) that ListOffsets (`version`) answers for `spec` (an OffsetSpec or a
    timestamp) at each partition's leader as `bootstrap`'s Metadata names it (a proxy's address for a proxy)
    (`quiet`: an error answer is {} — a proxy still loading its tier answers a retriable error, as a broker loading
    would; `isolation` 1: read_committed, LATEST is the last stable offset)."""
    with WireClient(bootstrap) as w:
        md = w.request(ApiKey.METADATA, 12, {"topics": [{"name": topic, "topic_id": bytes(16)}],
                                             "allow_auto_topic_creation": False,
                                             "include_topic_authorized_operations": False})
    brokers = {n["node_id"]: f"{n['host']}:{n['port']}" for n in md["brokers"]}
    out = {}
    for x in md["topics"][0]["partitions"]:
        p = x["partition_index"]
        with WireClient(brokers[x["leader_id"]]) as w:
            resp = w.request(ApiKey.LIST_OFFSETS, version, list_offsets_request({topic: {p: spec}},
                                                                                isolation=isolation))
        r = resp["topics"][0]["partitions"][0]
        if quiet and r["error_code"]:
            return {}
        assert r["error_code"] == 0, r
        out[p] = (r["offset"], r["leader_epoch"])
    return out
