"""`tierproxy tier` against the real broker: byte-exact copies of every batch kind, transactions spanning a
segment boundary, the broker's retention afterwards, S3, and compacted topics."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from confluent_kafka import Producer

from tests.support.fetchraw import fetch_raw
from tests.support.kafka import broker_forgets, create_topic
from tests.support.s3 import S3Server, ServerCounts
from tests.support.tiering import offsets_of, produce_everything, settings, tier_once, tiered
from tests.support.waiting import wait_until
from tierproxy.dev.kafkadist import KafkaCluster

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


def test_tier_once_copies_every_batch_byte_for_byte(kafka: KafkaCluster, tmp_path: Path, topic_name: str) -> None:
    create_topic(kafka.bootstrap, topic_name, config={"segment.ms": "500"})
    produce_everything(kafka.bootstrap, topic_name)
    served, _ = fetch_raw(kafka.bootstrap, topic_name)  # what the broker serves before retention runs
    _, broker_aborted = fetch_raw(kafka.bootstrap, topic_name, isolation=1)
    s = settings(kafka.bootstrap, tmp_path, topic_name, tier_segment_bytes=8 * 1024)
    summary = tier_once(s)
    assert summary.failed == 0 and summary.segments >= 8 and summary.gaps == []

    segs, remote, aborted = tiered(s, topic_name)
    # everything the broker served before the pass is in the tier, byte for byte, batch for batch (the
    # coordinator may append a marker meanwhile: the tier may hold more, never different)
    assert remote[:len(served)] == served
    assert offsets_of(remote) == list(range(offsets_of(remote)[-1] + 1))  # no hole, no duplicate
    for a, b in itertools.pairwise(segs):
        assert b.start_offset == a.end_offset + 1
    # the broker reports a transaction again in every fetch response its range overlaps: compare it as a set
    assert sorted((a.producer_id, a.first_offset) for a in aborted) == sorted(
        {(a["producer_id"], a["first_offset"]) for a in broker_aborted})
    spanning = [a for a in aborted if not any(md.start_offset <= a.first_offset and a.last_offset <= md.end_offset
                                              for md in segs)]
    assert spanning, "no aborted transaction crossed a segment boundary: the test lost its point"

    broker_forgets(kafka.bootstrap, topic_name, restore_ms=None)  # now the broker deletes: the tier keeps all
    assert tiered(s, topic_name)[1] == remote


def test_second_pass_continues_where_the_first_stopped(kafka: KafkaCluster, tmp_path: Path, topic_name: str) -> None:
    create_topic(kafka.bootstrap, topic_name, partitions=2)
    p = Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 5})
    for i in range(2000):
        p.produce(topic_name, f"first-{i}".encode() * 10, partition=i % 2)
    p.flush(30)
    s = settings(kafka.bootstrap, tmp_path, topic_name)
    first = tier_once(s)
    for i in range(2000):
        p.produce(topic_name, f"second-{i}".encode() * 10, partition=i % 2)
    p.flush(30)
    second = tier_once(s)
    assert first.segments > 0 and second.segments > 0
    for partition in (0, 1):
        _, remote, _ = tiered(s, topic_name, partition)
        served, _ = fetch_raw(kafka.bootstrap, topic_name, partition)
        assert remote == served
    assert tier_once(s).segments == 0  # nothing new: nothing copied


@pytest.mark.s3
def test_tier_to_s3(kafka: KafkaCluster, s3: S3Server, tmp_path: Path, topic_name: str) -> None:
    create_topic(kafka.bootstrap, topic_name)
    p = Producer({"bootstrap.servers": kafka.bootstrap, "compression.type": "zstd"})
    for i in range(3000):
        p.produce(topic_name, f"s3-{i}".encode() * 20)
    p.flush(30)

    s3.create_bucket("tier")

    s = settings(kafka.bootstrap, tmp_path, topic_name,
                 storage=f"s3://tier/prod?endpoint={s3.endpoint}&region={s3.region}")
    before = s3.counted("tier")
    first = tier_once(s)
    assert first.segments > 0
    # the pass's requests (driver's and copy tasks') and bytes are what the S3 server counted. SeaweedFS counts a
    # request once its handler has returned, which may be after the pass got its answer: its counts are read until
    # they reach the pass's (bounded), then compared
    ours = (sum(first.storage["requests"].values()), first.storage["bytes_written"], first.storage["bytes_read"])

    def counted() -> ServerCounts | None:
        theirs = s3.counted("tier") - before
        reached = all(t >= o for t, o in zip((sum(theirs.requests.values()), theirs.received, theirs.sent), ours,
                                             strict=True))
        return theirs if reached else None

    theirs = wait_until(counted, f"SeaweedFS's count to reach the pass's {ours}", timeout=10, interval=0.05)
    assert sum(first.storage["requests"].values()) == sum(theirs.requests.values()) > first.segments
    assert (first.storage["bytes_written"], first.storage["bytes_read"]) == (theirs.received, theirs.sent)
    assert first.storage["bytes_written"] > first.bytes
    served, _ = fetch_raw(kafka.bootstrap, topic_name)
    assert tiered(s, topic_name)[1] == served
    # a pass with nothing new lists no segment's objects: the unfinished uploads and the snapshots, one page each
    idle = tier_once(s)
    assert idle.segments == 0 and idle.storage["requests"]["list"] == 2
    assert idle.storage["requests"]["part"] == 0 and idle.storage["bytes_written"] < first.storage["bytes_written"]


def test_compact_only_topics_are_tiered_as_the_broker_holds_them(kafka: KafkaCluster, tmp_path: Path,
                                                                  topic_name: str) -> None:
    """`cleanup.policy=compact` alone (the broker deletes nothing: the tier gives backups, restore, Spark and
    Iceberg): tiered byte for byte, as any topic (skipped before issue 66)."""
    create_topic(kafka.bootstrap, topic_name, config={"cleanup.policy": "compact"})
    p = Producer({"bootstrap.servers": kafka.bootstrap})
    for i in range(100):
        p.produce(topic_name, f"v{i}".encode(), f"k{i % 7}".encode())
    p.flush(10)
    served, _ = fetch_raw(kafka.bootstrap, topic_name)
    s = settings(kafka.bootstrap, tmp_path, topic_name, tier_cleaner_enable=False)  # (the tier's own: compaction_step)
    assert tier_once(s).segments == 1
    segs, raw, _ = tiered(s, topic_name)
    assert raw == served and (segs[0].start_offset, segs[0].end_offset) == (0, 99)
