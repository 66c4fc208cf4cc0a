"""RLMM on the real broker (metadata topic) and on a file: the seed KIP's five scenarios, read-your-writes,
restart from checkpoint + topic tail, and compaction by the broker's log cleaner."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from tests.support.kafka import watermarks
from tests.support.segments import Partition, one_pass, seg, tp
from tierproxy.dev.kafkadist import KafkaCluster
from tierproxy.tier.model import (
    IllegalStateTransition,
    PartitionDeleteState,
    RemoteLogStartOffset,
    RemotePartitionDeleteMetadata,
    SegmentState,
    uuid_str,
)
from tierproxy.tier.rlmm import RemoteLogMetadataManager, transition
from tierproxy.tier.rlmm_file import FileRLMM
from tierproxy.tier.rlmm_topic import TopicRLMM
from tierproxy.tier.serde import encode_value

S = SegmentState
P = PartitionDeleteState


@pytest.fixture(params=["file", pytest.param("topic", marks=pytest.mark.kafka)])
def make(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[..., RemoteLogMetadataManager]:
    if request.param == "file":
        return lambda **kw: FileRLMM(tmp_path / "rlmm")
    kafka: KafkaCluster = request.getfixturevalue("kafka")
    topic = f"__rlmm-{uuid.uuid4().hex[:8]}"
    return lambda **kw: TopicRLMM(kafka.bootstrap, topic=topic, partitions=3, replication=1, **kw)


@asynccontextmanager
async def opened(r: RemoteLogMetadataManager) -> AsyncIterator[RemoteLogMetadataManager]:
    await r.start()
    try:
        yield r
    finally:
        await r.close()


def run(coro: Coroutine[Any, Any, None]) -> None:
    asyncio.run(coro)


def _state(r: RemoteLogMetadataManager) -> set[tuple[bytes, int, int, int]]:
    return {(md.segment_id.id, md.start_offset, md.end_offset, int(md.state))
            for pc in r.cache.partitions.values() for md in pc.segments.values()}


def test_scenario_1_normal_upload(make: Callable[..., RemoteLogMetadataManager]) -> None:
    async def go() -> None:
        t = tp("orders")
        async with opened(make()) as r, opened(make()) as reader:
            md = seg(t, 0, 999, {3: 0}, broker_epoch=3)
            await r.add_segment(md)
            assert r.segment_for(t, 10, 3) is None  # not served before FINISHED
            await r.update_segment(transition(md, S.COPY_SEGMENT_FINISHED))
            assert r.segment_for(t, 10, 3).segment_id == md.segment_id  # read-your-writes
            await reader.catch_up()
            assert reader.segment_for(t, 999, 3).segment_id == md.segment_id  # another instance sees it
            assert r.keys[(t.topic_id, 0)] == {f"{uuid_str(t.topic_id)}:0:999:3".encode()}

    run(go())


def test_scenario_2_leadership_change_during_upload(make: Callable[..., RemoteLogMetadataManager]) -> None:
    async def go() -> None:
        t = tp("orders")
        async with opened(make()) as r:
            old = seg(t, 0, 999, {3: 0}, broker_epoch=3)
            new = seg(t, 0, 999, {3: 0}, broker_epoch=4)
            await r.add_segment(old)
            await r.add_segment(new)
            await r.update_segment(transition(new, S.COPY_SEGMENT_FINISHED))
            await r.update_segment(transition(old, S.COPY_SEGMENT_FINISHED))  # the old leader finishes late
            assert r.segment_for(t, 500, 3).segment_id == new.segment_id
            assert old.segment_id.id in r.partition(t).unreferenced
            assert len(r.keys[(t.topic_id, 0)]) == 2  # different epochs, different keys

    run(go())


def test_scenario_3_failed_upload_retried(make: Callable[..., RemoteLogMetadataManager]) -> None:
    async def go() -> None:
        t = tp("orders")
        async with opened(make()) as r:
            failed = seg(t, 0, 999, {3: 0}, broker_epoch=3)
            await r.add_segment(failed)
            retry = seg(t, 0, 999, {3: 0}, broker_epoch=3)  # same epoch → same key, new uuid
            await r.add_segment(retry)
            await r.update_segment(transition(retry, S.COPY_SEGMENT_FINISHED))
            await r.update_segment(transition(failed, S.DELETE_SEGMENT_STARTED))
            await r.update_segment(transition(failed, S.DELETE_SEGMENT_FINISHED))
            assert r.segment_for(t, 0, 3).segment_id == retry.segment_id
            assert failed.segment_id.id not in r.partition(t).segments
            assert r.keys[(t.topic_id, 0)] == {f"{uuid_str(t.topic_id)}:0:999:3".encode()}  # the shared key lives
            with pytest.raises(IllegalStateTransition):
                await r.update_segment(transition(failed, S.COPY_SEGMENT_FINISHED))

    run(go())


def test_scenario_4_segment_deletion_tombstones_every_key(make: Callable[..., RemoteLogMetadataManager]) -> None:
    async def go() -> None:
        t = tp("orders")
        async with opened(make()) as r:
            uploads = [seg(t, 0, 1000, {3: 0}, broker_epoch=e) for e in (3, 4, 5)]
            for md in uploads:
                await r.add_segment(md)
                await r.update_segment(transition(md, S.COPY_SEGMENT_FINISHED))
            for md in uploads:
                await r.update_segment(transition(md, S.DELETE_SEGMENT_STARTED, broker_leader_epoch=6))
                await r.update_segment(transition(md, S.DELETE_SEGMENT_FINISHED, broker_leader_epoch=6))
            assert r.segments(t) == []
            assert r.keys.get((t.topic_id, 0), set()) == set()  # all 4 keys (epochs 3, 4, 5, 6) tombstoned

    run(go())


def test_scenario_5_partition_deletion(make: Callable[..., RemoteLogMetadataManager]) -> None:
    async def go() -> None:
        t = tp("orders", 1)
        async with opened(make()) as r:
            mds = [seg(t, i * 100, i * 100 + 99) for i in range(3)]
            for md in mds:
                await r.add_segment(md)
                await r.update_segment(transition(md, S.COPY_SEGMENT_FINISHED))
            await r.put_partition_delete(RemotePartitionDeleteMetadata(t, P.DELETE_PARTITION_MARKED, 1, -1))
            await r.put_partition_delete(RemotePartitionDeleteMetadata(t, P.DELETE_PARTITION_STARTED, 2, 101))
            with pytest.raises(ValueError, match="not deleted yet"):
                await r.put_partition_delete(RemotePartitionDeleteMetadata(t, P.DELETE_PARTITION_FINISHED, 3, 101))
            for md in mds:
                await r.update_segment(transition(md, S.DELETE_SEGMENT_STARTED))
                await r.update_segment(transition(md, S.DELETE_SEGMENT_FINISHED))
            await r.put_partition_delete(RemotePartitionDeleteMetadata(t, P.DELETE_PARTITION_FINISHED, 3, 101))
            assert r.cache.deletions[(t.topic_id, 1)].state == P.DELETE_PARTITION_FINISHED
            assert r.keys[(t.topic_id, 1)] == {f"{uuid_str(t.topic_id)}:1".encode()}  # only the marker remains
            with pytest.raises(IllegalStateTransition):
                await r.put_partition_delete(RemotePartitionDeleteMetadata(t, P.DELETE_PARTITION_MARKED, 4, -1))

    run(go())


def test_a_purged_log_start_reaches_every_instance_and_is_tombstoned_with_the_partition(
        make: Callable[..., RemoteLogMetadataManager]) -> None:
    async def go() -> None:
        t = tp("repartition", 2)
        async with opened(make()) as r:
            md = seg(t, 0, 99)
            await r.add_segment(md)
            await r.update_segment(transition(md, S.COPY_SEGMENT_FINISHED))
            assert await r.put_log_start(t, 40)
            assert not await r.put_log_start(t, 40)  # not above the current one: nothing written
            async with opened(make()) as reader:
                await reader.catch_up()
                pc = reader.partition(t)
                assert pc is not None and pc.log_start_offset == 40 and pc.earliest_offset() == 40
            key = f"{uuid_str(t.topic_id)}:2:logStart:40".encode()
            assert key in r.keys[(t.topic_id, 2)]
            # a higher log start retires the lower key; a lower one recorded by a replica that had not seen it yet
            # (a race) stands beside it, and the highest wins wherever they are applied, in any order
            assert await r.put_log_start(t, 60)
            higher = f"{uuid_str(t.topic_id)}:2:logStart:60".encode()
            assert key not in r.keys[(t.topic_id, 2)] and higher in r.keys[(t.topic_id, 2)]
            async with opened(make()) as late:
                await late.publish([(key, encode_value(RemoteLogStartOffset(t, 40, 5)))])
            async with opened(make()) as reader:
                pc = reader.partition(t)
                assert pc is not None and pc.log_start_offset == 60
            key = higher
            await r.put_partition_delete(RemotePartitionDeleteMetadata(t, P.DELETE_PARTITION_MARKED, 1, -1))
            await r.put_partition_delete(RemotePartitionDeleteMetadata(t, P.DELETE_PARTITION_STARTED, 2, -1))
            await r.update_segment(transition(md, S.DELETE_SEGMENT_STARTED))
            await r.update_segment(transition(md, S.DELETE_SEGMENT_FINISHED))
            await r.put_partition_delete(RemotePartitionDeleteMetadata(t, P.DELETE_PARTITION_FINISHED, 3, -1))
            assert key not in r.keys[(t.topic_id, 2)]  # the log start record went with the partition

    run(go())


@pytest.mark.kafka
def test_restart_replays_only_the_tail_after_the_checkpoint(kafka: KafkaCluster, tmp_path: Path) -> None:
    topic = f"__rlmm-{uuid.uuid4().hex[:8]}"
    ckpt = tmp_path / "ckpt"

    def new(**kw: Any) -> TopicRLMM:
        return TopicRLMM(kafka.bootstrap, topic=topic, partitions=3, replication=1, **kw)

    async def go() -> None:
        parts = [tp("orders", p) for p in range(4)]
        async with opened(new(checkpoint_dir=ckpt)) as first:
            for t in parts:
                for i in range(10):
                    md = seg(t, i * 10, i * 10 + 9)
                    await first.add_segment(md)
                    await first.update_segment(transition(md, S.COPY_SEGMENT_FINISHED))
            # a batch crossing the last range's boundary: that range comes back empty and is deleted, and its
            # planned end is the live segment's real end (before: same key, the restart lost the segment)
            await one_pass(first, tp("crossing"), Partition([95, 11]), 100, set(), 0)
            before = _state(first)
        assert (0, 105, int(S.COPY_SEGMENT_FINISHED)) in {s[1:] for s in before}
        assert [p.name for p in ckpt.iterdir()] == [f"{topic}.checkpoint"]  # one file for the 3 partitions
        async with opened(new()) as other:  # the tail, written while the first was down
            for t in parts[:2]:
                md = other.partition(t).all_segments()[0]
                await other.update_segment(transition(md, S.DELETE_SEGMENT_STARTED))
            after_tail = _state(other)
        assert after_tail != before
        async with opened(new(checkpoint_dir=ckpt)) as restarted:
            assert _state(restarted) == after_tail
            assert restarted.records_consumed == 2  # only the tail was read from the topic
        async with opened(new()) as full:
            assert _state(full) == after_tail
            # each upload: STARTED under its id key, FINISHED under its end offset's key + the id key's tombstone;
            # the crossing pass 7 (two STARTED, one finished, the empty one's two deletions and tombstone)
            assert full.records_consumed == 4 * 10 * 3 + 7 + 2

    run(go())


def _count_records(bootstrap: str, topic: str) -> tuple[int, int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"count-{uuid.uuid4().hex[:6]}",
                  "enable.auto.commit": False, "auto.offset.reset": "earliest", "enable.partition.eof": True})
    c.assign([TopicPartition(topic, 0, 0)])
    n = tombstones = 0
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is None:
            continue
        if m.error() is not None:
            break  # partition EOF
        n += 1
        tombstones += m.value() is None
    c.close()
    return n, tombstones


@pytest.mark.kafka
def test_log_cleaner_compacts_the_metadata_topic(kafka: KafkaCluster) -> None:
    topic = f"__rlmm-{uuid.uuid4().hex[:8]}"
    fast = {"segment.ms": "200", "min.cleanable.dirty.ratio": "0.01", "delete.retention.ms": "1000",
            "min.compaction.lag.ms": "0"}

    def new() -> TopicRLMM:
        return TopicRLMM(kafka.bootstrap, topic=topic, partitions=1, replication=1, topic_config=fast)

    async def go() -> set[tuple[bytes, int, int, int]]:
        t = tp("orders")
        async with opened(new()) as r:
            mds = [seg(t, i * 100, i * 100 + 99) for i in range(40)]
            for md in mds:
                await r.add_segment(md)
                await r.update_segment(transition(md, S.COPY_SEGMENT_FINISHED))
            for md in mds[:30]:  # retention deletes 75%
                await r.update_segment(transition(md, S.DELETE_SEGMENT_STARTED))
                await r.update_segment(transition(md, S.DELETE_SEGMENT_FINISHED))
            # an empty last range planned to end where the segment before it really ends: compaction keeps both
            await one_pass(r, tp("crossing"), Partition([95, 11]), 100, set(), 0)
            state = _state(r)
            assert (0, 105, int(S.COPY_SEGMENT_FINISHED)) in {s[1:] for s in state}
            return state

    expected = asyncio.run(go())
    # offsets are never reused, so the log end counts what was written even if the cleaner already ran
    written = watermarks(kafka.bootstrap, topic)[1]
    # per upload: STARTED (id key), FINISHED (end offset key) + the id key's tombstone; per deletion two records
    # and a tombstone; the crossing pass 7
    assert written == 40 * 3 + 30 * 3 + 7

    async def tick() -> None:  # appends roll the active segment so the cleaner can work on the rest
        async with opened(new()) as r:
            md = seg(tp("ticks"), 0, 0)
            await r.add_segment(md)

    deadline = time.monotonic() + 90
    remaining = written
    while time.monotonic() < deadline:
        time.sleep(1.0)
        asyncio.run(tick())
        remaining, tombstones = _count_records(kafka.bootstrap, topic)
        if remaining <= 11 + 10 and tombstones == 0:
            break
    assert remaining < written / 4, f"the topic still holds {remaining} of {written} records"

    async def reread() -> set[tuple[bytes, int, int, int]]:
        async with opened(new()) as r:
            return {s for s in _state(r) if s[2] > 0}

    assert asyncio.run(reread()) == expected  # the compacted topic alone rebuilds the same cache


@pytest.mark.kafka
def test_audit_topic_keeps_the_full_history(kafka: KafkaCluster) -> None:
    topic, audit = f"__rlmm-{uuid.uuid4().hex[:8]}", f"__rlmm-audit-{uuid.uuid4().hex[:8]}"

    async def go() -> None:
        async with opened(TopicRLMM(kafka.bootstrap, topic=topic, partitions=1, replication=1,
                                    audit_topic=audit)) as r:
            md = seg(tp("orders"), 0, 9)
            await r.add_segment(md)
            for state in (S.COPY_SEGMENT_FINISHED, S.DELETE_SEGMENT_STARTED, S.DELETE_SEGMENT_FINISHED):
                await r.update_segment(transition(md, state))

    asyncio.run(go())
    n, tombstones = _count_records(kafka.bootstrap, audit)
    assert (n, tombstones) == (4, 0)  # every lifecycle event, no tombstones
    n, tombstones = _count_records(kafka.bootstrap, topic)
    assert tombstones == 2 and n == 6  # the id key retired at FINISHED, the end offset key at DELETE_FINISHED


@pytest.mark.kafka
def test_a_malformed_metadata_record_is_skipped_and_counted_not_fatal(kafka: KafkaCluster, tmp_path: Path,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    from confluent_kafka import Producer

    topic = f"__rlmm-{uuid.uuid4().hex[:8]}"

    def new(**kw: Any) -> TopicRLMM:
        return TopicRLMM(kafka.bootstrap, topic=topic, partitions=1, replication=1, **kw)

    async def go() -> None:
        t = tp("orders")
        async with opened(new()) as writer, opened(new()) as follower:
            first = seg(t, 0, 9)
            await writer.add_segment(first)
            await writer.update_segment(transition(first, S.COPY_SEGMENT_FINISHED))
            p = Producer({"bootstrap.servers": kafka.bootstrap})
            p.produce(topic, b"\x00\x07not a metadata record", b"garbage", partition=0)  # another writer's junk
            assert p.flush(10) == 0
            second = seg(t, 10, 19)
            await writer.add_segment(second)
            await writer.update_segment(transition(second, S.COPY_SEGMENT_FINISHED))
            await follower.catch_up()  # raises if its consumer died on the junk
            assert [m.start_offset for m in follower.segments(t)] == [0, 10]
            assert follower.records_skipped == 1 and writer.records_skipped == 1
        async with opened(new(checkpoint_dir=tmp_path / "ckpt")) as fresh:  # a new reader: the same view
            assert [m.start_offset for m in fresh.segments(t)] == [0, 10] and fresh.records_skipped == 1

    with caplog.at_level(logging.ERROR, logger="tierproxy"):
        run(go())
    assert "record skipped" in caplog.text


@pytest.mark.kafka
@pytest.mark.parametrize(("partitions", "config", "named"), [
    (2, {"cleanup.policy": "compact"}, "has 2 partitions, configured 3"),
    (3, {"cleanup.policy": "delete"}, "cleanup.policy=delete"),
])
def test_an_existing_metadata_topic_that_does_not_fit_is_a_clear_error(kafka: KafkaCluster, partitions: int,
                                                                        config: dict[str, str], named: str) -> None:
    from tests.support.kafka import create_topic
    from tierproxy.tier.rlmm_topic import MetadataTopicMismatch

    topic = f"__rlmm-{uuid.uuid4().hex[:8]}"
    create_topic(kafka.bootstrap, topic, partitions=partitions, config=config)

    async def go() -> None:
        r = TopicRLMM(kafka.bootstrap, topic=topic, partitions=3, replication=1)
        try:
            for _ in range(2):  # the caller retries: each failed start leaves no client behind
                with pytest.raises(MetadataTopicMismatch, match=named) as exc:
                    await r.start()
                assert topic in str(exc.value)
                assert r._consumer is None and r._producer is None
                assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task()] == []  # none running
        finally:
            await r.close()

    run(go())


@pytest.mark.kafka
def test_a_large_metadata_topic_is_read_however_long_it_takes_while_it_moves(kafka: KafkaCluster) -> None:
    """No fixed deadline for catch-up, only one on progress: a topic whose reading takes many times the stall
    timeout (here 0.3 s, 60 s by default; no checkpoint) is read whole. Before: a fixed 60 s for the whole
    catch-up, so a large metadata topic never became ready and the tier job could not start."""
    from confluent_kafka import Producer

    from tierproxy.tier.serde import segment_id_key

    topic, n = f"__rlmm-{uuid.uuid4().hex[:8]}", 100_000

    async def create() -> None:
        async with opened(TopicRLMM(kafka.bootstrap, topic=topic, partitions=1, replication=1)):
            pass

    run(create())
    t = tp("large")
    p = Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 20})
    for i in range(n):
        md = seg(t, i * 10, i * 10 + 9)
        p.produce(topic, encode_value(md), segment_id_key(md.segment_id), partition=0)
        if i % 5000 == 4999:
            p.flush(30)
    p.flush(30)

    async def read() -> tuple[int, float]:
        r = TopicRLMM(kafka.bootstrap, topic=topic, partitions=1, replication=1, stall_timeout_s=0.3)
        started = time.monotonic()
        async with opened(r):
            return len(r.segments(t)), time.monotonic() - started

    count, took = asyncio.run(read())
    assert count == n and took > 3 * 0.3, (count, took)


@pytest.mark.kafka
def test_a_new_metadata_topic_starts_without_errors_while_its_leaders_settle(kafka: KafkaCluster,
                                                                             caplog: pytest.LogCaptureFixture) -> None:
    """A first `serve` creates the 50-partition metadata topic and starts its consumer while the partitions' leaders
    are still being elected: aiokafka logged an ERROR (NotLeaderForPartitionError) per partition it retried, 4 to
    17 of them. Now at most one INFO line, and the filter is gone once the start is over."""
    from aiokafka import TopicPartition as AioTopicPartition
    from aiokafka.errors import NotLeaderForPartitionError

    caplog.set_level(logging.INFO)
    topic = f"__rlmm-settle-{uuid.uuid4().hex[:8]}"

    async def go() -> None:
        async with opened(TopicRLMM(kafka.bootstrap, topic=topic, replication=1)):  # 50 partitions, the default
            pass

    run(go())
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert len([r for r in caplog.records if "were still being elected" in r.getMessage()]) <= 1
    assert logging.getLogger("aiokafka.consumer.fetcher").filters == []
    from tierproxy.tier.rlmm_topic import SettlingLeaders

    elsewhere = logging.LogRecord("aiokafka.consumer.fetcher", logging.ERROR, __file__, 0,
                                  "Failed fetch offsets from %s: %s",
                                  (1, NotLeaderForPartitionError(AioTopicPartition("orders", 0))), None)
    assert SettlingLeaders(topic).filter(elsewhere), "another topic's error is never held back"
