"""The compaction step over groups of several tier segments (a topic's segment.bytes above the tier's copies):
a key map that fills inside a group, and a hole between served segments (a copy lost before it was refilled).
The step runs in this process (its tasks too: no Spark needed past the first copy)."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

import pytest
from confluent_kafka import Producer

from protocol.records import iter_batches
from tests.support.kafka import create_topic
from tests.support.replacing import compact
from tests.support.s3 import S3Server
from tests.support.tiering import settings, tier_once, tiered
from tierproxy.config import TierSettings
from tierproxy.dev.kafkadist import KafkaCluster
from tierproxy.jobs.tiering.housekeeping import delete_segment
from tierproxy.tier.open import open_metadata
from tierproxy.tier.replacement import cleaned
from tierproxy.tier.rsm import RemoteStorageManager

pytestmark = [pytest.mark.kafka, pytest.mark.spark]
KEYS, AGAIN = 3000, 300
# one group for the whole partition; cleaning settings that always find work
CONFIGS = {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01", "segment.bytes": str(1 << 30)}


def _produce(bootstrap: str, topic: str) -> dict[bytes, bytes]:
    """KEYS keys, then the first AGAIN of them written again, in small batches: → each key's latest value."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "batch.size": 1024})
    latest = {}
    for i in [*range(KEYS), *range(AGAIN)]:
        key, value = f"k{i:05d}".encode(), f"v{i}-{len(latest)}".encode()
        p.produce(topic, value, key)
        latest[key] = value
    p.flush(60)
    return latest


def _served(s: TierSettings, topic: str) -> tuple[list[tuple[int, bytes | None, bytes | None]], list[tuple[int, int]]]:
    """(every record the tier serves: offset, key, value; the served segments' ranges)."""
    segs, raw, _ = tiered(s, topic)
    records = [(r.offset, r.key, r.value) for b in iter_batches(raw) for r in b.records()]
    return records, [(md.start_offset, md.end_offset) for md in segs]


def test_a_key_map_filling_inside_a_group_still_cleans_what_it_covered(kafka: KafkaCluster, tmp_path: Path,
                                                                       topic_name: str) -> None:
    """A map of ~1,200 keys against 3,000 dirty ones, all the tier's segments in one group: the map fills inside
    one of the group's segments. The cleaning replaces the segments it covered (that one split in two) and the
    next passes go on; every key's latest value served after each. (Failed before: the new segments did not
    cover the whole group, so the replacement was rolled back at every pass: the tier never compacted.)"""
    create_topic(kafka.bootstrap, topic_name)
    latest = _produce(kafka.bootstrap, topic_name)
    s = settings(kafka.bootstrap, tmp_path, topic_name, tier_segment_bytes=8 * 1024)
    tier_once(s)
    records, spans = _served(s, topic_name)
    assert len(records) == KEYS + AGAIN and len(spans) >= 6

    for _ in range(4):
        summary = compact(s.metadata, s.storage, topic_name, 0, CONFIGS, map_bytes=32 * 1024)
        assert summary.failed == 0 and summary.segments_before >= 1, summary  # a replacement took place
        records, spans = _served(s, topic_name)
        assert {k: v for _, k, v in records} == latest
        assert all(b[0] == a[1] + 1 for a, b in itertools.pairwise(spans)) and spans[0][0] == 0
        if len(records) == KEYS:
            break
    assert len(records) == KEYS  # each key once: the cleanings went over the whole partition
    assert all(cleaned(md) for md in tiered(s, topic_name)[0])


def _make_hole(s: TierSettings, topic: str) -> tuple[int, int]:
    """Delete a served segment in the middle (as if its copy was lost and the broker no longer holds it): the
    tier then has a hole there. → its range."""
    async def run() -> tuple[int, int]:
        rlmm = open_metadata(s.metadata, "", writer=True)
        await rlmm.start()
        rsm = RemoteStorageManager.from_uri(s.storage)
        try:
            pc = rlmm.cache.find(topic, 0)
            assert pc is not None
            served = list(pc.finished())
            md = served[len(served) // 2]
            await delete_segment(rlmm, rsm, md)
            return md.start_offset, md.end_offset
        finally:
            await rsm.close()
            await rlmm.close()

    return asyncio.run(run())


def test_a_hole_between_tier_segments_is_never_inside_a_replacement(kafka: KafkaCluster, tmp_path: Path,
                                                                   topic_name: str) -> None:
    """A hole in the middle of a compacted partition's tier: the step cleans on either side of it and the hole
    stays a hole (no new segment claims offsets the tier does not hold); the step does not fail the pass.
    (Failed before: one group spanned the hole, and recording its replacement raised ValueError out of the step,
    ending the tier pass, at every pass.)"""
    create_topic(kafka.bootstrap, topic_name)
    latest = _produce(kafka.bootstrap, topic_name)
    s = settings(kafka.bootstrap, tmp_path, topic_name, tier_segment_bytes=8 * 1024)
    tier_once(s)
    first, last = _make_hole(s, topic_name)
    before, _ = _served(s, topic_name)

    summary = compact(s.metadata, s.storage, topic_name, 0, CONFIGS)
    assert summary.failed == 0 and summary.segments_before >= 2, summary
    records, spans = _served(s, topic_name)
    assert any(cleaned(md) for md in tiered(s, topic_name)[0])
    assert not any(a <= last and b >= first for a, b in spans), (first, last, spans)  # the hole stays one
    assert [(a[1] + 1, b[0]) for a, b in itertools.pairwise(spans) if b[0] != a[1] + 1] == [(first, last + 1)]
    # what the tier held on either side, each key's newest there, is still served
    newest = {k: v for _, k, v in before}
    assert {k: v for _, k, v in records} == newest and len(records) < len(before)
    assert set(newest.items()) <= set(latest.items()) | {(k, v) for _, k, v in before}


def test_a_cleaning_reads_each_log_at_most_twice(kafka: KafkaCluster, s3: S3Server, tmp_path: Path,
                                                 topic_name: str) -> None:
    """On S3, a cleaning reads each segment's log for its key map and for its copy, and its aborted transactions
    from the txn index alone. (Failed before: the task also read every log whole for its txn index entries, a
    third of what it read.)"""
    create_topic(kafka.bootstrap, topic_name)
    latest = _produce(kafka.bootstrap, topic_name)
    s3.create_bucket("tier")
    s = settings(kafka.bootstrap, tmp_path, topic_name, tier_segment_bytes=8 * 1024,
                 storage=f"s3://tier/c?endpoint={s3.endpoint}&region={s3.region}")
    tier_once(s)
    logs = sum(md.segment_size_in_bytes for md in tiered(s, topic_name)[0])

    summary = compact(s.metadata, s.storage, topic_name, 0, CONFIGS)
    assert summary.segments_before >= 6 and summary.bytes_before == logs, summary
    assert {k: v for _, k, v in _served(s, topic_name)[0]} == latest
    assert logs * 2 <= summary.storage["bytes_read"] < logs * 2.2, (summary.storage, logs)
