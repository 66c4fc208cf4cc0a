"""The compaction step of `tierproxy tier` against the real broker, file tier and Spark: a compacted topic's tiered
partitions cleaned by the engine in a Spark task each, recorded as replacements; what the tier then serves."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from confluent_kafka import Producer

from protocol.records import iter_batches
from tests.support.kafka import create_topic, set_topic_config
from tests.support.replacing import killed_at, objects_against_metadata
from tests.support.tiering import settings, tier_once, tiered
from tierproxy.config import TierSettings
from tierproxy.dev.kafkadist import KafkaCluster
from tierproxy.tier.model import SegmentState
from tierproxy.tier.replacement import cleaned, generation

pytestmark = [pytest.mark.kafka, pytest.mark.spark]
KEYS, ROUNDS = 200, 12


def _history(bootstrap: str, topic: str) -> dict[bytes, bytes | None]:
    """KEYS keys updated ROUNDS times, every 7th key's last write a tombstone: → each key's latest value."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "batch.size": 8 * 1024})
    latest: dict[bytes, bytes | None] = {}
    for r, k in itertools.product(range(ROUNDS), range(KEYS)):
        key = f"key-{k}".encode()
        value = None if r == ROUNDS - 1 and k % 7 == 0 else f"value-{k}-{r}-".encode() * 8
        p.produce(topic, value, key)
        latest[key] = value
    p.flush(60)
    return latest


def _records(raw: bytes) -> list[tuple[int, bytes | None, bytes | None]]:
    out = []
    for batch in iter_batches(raw):
        assert batch.crc_ok(), batch.base_offset
        out += [(r.offset, r.key, r.value) for r in batch.records()]
    return out


def test_a_compacted_topic_is_cleaned_in_the_tier(kafka: KafkaCluster, tmp_path: Path, topic_name: str) -> None:
    create_topic(kafka.bootstrap, topic_name)  # tiered as a delete topic, then made compacted
    latest = _history(kafka.bootstrap, topic_name)
    s = settings(kafka.bootstrap, tmp_path, topic_name, tier_segment_delete_delay_ms=0, tier_orphan_timeout_ms=0)
    tier_once(s)
    segs, raw, _ = tiered(s, topic_name)
    before = _records(raw)
    assert len(before) == KEYS * ROUNDS and len(segs) >= 4
    for key, value in (("cleanup.policy", "compact"), ("min.cleanable.dirty.ratio", "0.01")):
        set_topic_config(kafka.bootstrap, topic_name, key, value)

    summary = tier_once(s)
    c = summary.compaction
    assert (c["partitions"], c["failed"], c["segments_before"]) == (1, 0, len(segs)), summary
    assert c["bytes_after"] < c["bytes_before"] / 4 and f"compacted 1 partitions: {len(segs)} ->" in summary.line()
    after_segs, raw_after, _ = tiered(s, topic_name)
    assert all(cleaned(md) for md in after_segs)
    assert after_segs[0].start_offset == 0 and after_segs[-1].end_offset == segs[-1].end_offset
    for a, b in itertools.pairwise(after_segs):
        assert b.start_offset == a.end_offset + 1  # every offset still the tier's: no hole
    after = _records(raw_after)
    # each key once, at the offset it had, with its latest value (a tombstone kept within delete.retention.ms)
    assert {k: v for _, k, v in after} == latest and len(after) == KEYS
    assert set(after) <= set(before)

    again = tier_once(s)  # nothing more to clean; the replaced segments' objects deleted (delay 0)
    assert not again.compaction.get("partitions")
    found, named, states = objects_against_metadata(s, topic_name)
    assert found == named and states == {SegmentState.COPY_SEGMENT_FINISHED}


def _served_latest(s: TierSettings, topic: str, latest: dict[bytes, bytes | None]) -> None:
    """Every key's latest value served by the tier, no offset served twice, no hole between segments."""
    segs, raw, _ = tiered(s, topic)
    for a, b in itertools.pairwise(segs):
        assert b.start_offset == a.end_offset + 1, (a, b)
    records = _records(raw)
    offsets = [o for o, _, _ in records]
    assert offsets == sorted(set(offsets))
    assert {k: v for _, k, v in records} == latest  # (the newest record of each key is its latest value)


def test_kill_9_at_each_step_of_a_tier_compaction_then_a_pass(kafka: KafkaCluster, tmp_path: Path,
                                                              topic_name: str) -> None:
    """The step runs in a process of its own (its tasks in that process: no JVM to start) with the engine,
    killed at each pause point; the broker's topic stays `delete`, so only the killed step compacts."""
    create_topic(kafka.bootstrap, topic_name)
    latest = _history(kafka.bootstrap, topic_name)
    s = settings(kafka.bootstrap, tmp_path, topic_name, tier_segment_delete_delay_ms=0, tier_orphan_timeout_ms=0)
    tier_once(s)
    configs = {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01"}
    rerun = {"started": "orphans_cleaned", "uploaded": "orphans_cleaned", "finished": "retired",
             "retired": "retired_deleted", "deleting": "retired_deleted"}
    for point, what in rerun.items():
        killed_at(s, topic_name, point, tmp_path, configs=configs)
        _served_latest(s, topic_name, latest)  # killed there: every key's latest value, each offset once
        latest.update(_history(kafka.bootstrap, topic_name))  # more to clean at the next kill
        summary = tier_once(s)  # copies the new history; finishes the killed step or rolls it back
        assert getattr(summary, what) >= 1, (point, summary)
        _served_latest(s, topic_name, latest)
        found, named, states = objects_against_metadata(s, topic_name)
        assert found == named, (point, found ^ named)  # nothing leaked
        assert states == {SegmentState.COPY_SEGMENT_FINISHED}, point
    assert any(cleaned(md) for md in tiered(s, topic_name)[0])


def test_a_key_map_too_small_for_the_dirty_keys_cleans_over_several_passes(kafka: KafkaCluster, tmp_path: Path,
                                                                           topic_name: str) -> None:
    """50,000 keys against a map of 1 MiB (~39,000 keys, Kafka's least log.cleaner.dedupe.buffer.size): the first
    pass cleans as far as the map reaches and splits the segment it filled inside into two new segments (the
    rest not cleaned); the next pass goes on from there. Every key's latest value served after each."""
    create_topic(kafka.bootstrap, topic_name)
    p = Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 5, "batch.size": 16 * 1024})
    latest: dict[bytes, bytes | None] = {}
    for i in [*range(50_000), *range(1000)]:  # the first 1000 keys written again at the end
        key, value = f"k{i:05d}".encode(), f"v{i}-{len(latest)}".encode()
        p.produce(topic_name, value, key)
        latest[key] = value
    p.flush(60)
    s = settings(kafka.bootstrap, tmp_path, topic_name, tier_segment_bytes=256 * 1024, tier_orphan_timeout_ms=0,
                 tier_segment_delete_delay_ms=0, tier_cleaner_dedupe_buffer_size=1 << 20)
    tier_once(s)
    for key, value in (("cleanup.policy", "compact"), ("min.cleanable.dirty.ratio", "0.01")):
        set_topic_config(kafka.bootstrap, topic_name, key, value)

    first = tier_once(s)
    assert first.compaction["partitions"] == 1 and first.compaction["failed"] == 0, first
    segs = tiered(s, topic_name)[0]
    assert any(generation(md) and not cleaned(md) for md in segs)  # the rest of the segment the map filled in
    _served_latest(s, topic_name, latest)
    assert len(_records(tiered(s, topic_name)[1])) > 50_000  # the rewritten keys' first values not yet gone

    second = tier_once(s)
    assert second.compaction["partitions"] == 1, second
    _served_latest(s, topic_name, latest)
    assert len(_records(tiered(s, topic_name)[1])) == 50_000  # each key once now
    tier_once(s)  # what the second pass replaced is deleted at the next one's start (a delay of 0)
    found, named, states = objects_against_metadata(s, topic_name)
    assert found == named and states == {SegmentState.COPY_SEGMENT_FINISHED}
