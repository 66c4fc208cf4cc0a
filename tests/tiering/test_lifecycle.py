"""Lifecycle around the copies: kill -9 mid-upload then rerun, remote retention, topic deletion, gap alarm."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from tests.support.fetchraw import fetch_raw
from tests.support.kafka import broker_forgets, create_topic, set_retention, small_segments, watermarks
from tests.support.tiering import offsets_of, settings, tier_once, tiered
from tests.support.waiting import wait_until
from tierproxy.dev.kafkadist import KafkaCluster
from tierproxy.tier.ownership import OWNER_OBJECT
from tierproxy.tier.rlmm_file import FileRLMM

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


def _fill(bootstrap: str, topic: str, n: int, partitions: int = 1, size: int = 200) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "batch.size": 16 * 1024})  # fits a small segment
    for i in range(n):
        p.produce(topic, os.urandom(size), f"k{i}".encode(), partition=i % partitions)
    p.flush(60)


def _objects(root: Path) -> list[Path]:
    """The segments' objects (not the tier's record of its cluster, nor its snapshots)."""
    return sorted(p for p in root.rglob("*") if p.is_file() and not p.name.startswith(".tmp-")
                  and p.name != OWNER_OBJECT and "snapshots" not in p.relative_to(root).parts)


def test_kill_9_mid_upload_then_rerun(kafka: KafkaCluster, tmp_path: Path, topic_name: str) -> None:
    create_topic(kafka.bootstrap, topic_name, partitions=2)
    _fill(kafka.bootstrap, topic_name, 40_000, partitions=2, size=500)
    env = {**os.environ, "TIERPROXY_TIER_SEGMENT_BYTES": str(256 * 1024), "TIERPROXY_SPARK_MASTER": "local[1]",
           "TIERPROXY_TIER_STATE_DIR": str(tmp_path / "state")}
    cmd = [sys.executable, "-m", "tierproxy.cli", "tier", "--once", "--no-progress", "--bootstrap-server",
           kafka.bootstrap, "--storage", f"file://{tmp_path}/tier", "--metadata", f"file://{tmp_path}/meta",
           "--topics", topic_name]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    records = tmp_path / "meta" / "remote_log_metadata.records"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not len(_objects(tmp_path / "tier")) > 6:
        time.sleep(0.05)  # some copies have landed; others are still on the way
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)
    assert records.exists() and _objects(tmp_path / "tier"), "killed before any upload started"

    s = settings(kafka.bootstrap, tmp_path, topic_name, tier_segment_bytes=256 * 1024, tier_orphan_timeout_ms=0)
    summary = tier_once(s)
    assert summary.orphans_cleaned > 0 and summary.failed == 0
    for partition in (0, 1):
        segs, remote, _ = tiered(s, topic_name, partition)
        served, _ = fetch_raw(kafka.bootstrap, topic_name, partition)
        assert remote == served  # no duplicate, no missing offset
        assert offsets_of(remote) == list(range(len(offsets_of(served))))
    segs = tiered(s, topic_name, 0)[0] + tiered(s, topic_name, 1)[0]
    assert len(_objects(tmp_path / "tier")) == 6 * len(segs)  # no half segment left behind


def test_retention_and_topic_deletion_lifecycles(kafka: KafkaCluster, tmp_path: Path, topic_name: str) -> None:
    import asyncio

    create_topic(kafka.bootstrap, topic_name, config=small_segments(64 * 1024))
    _fill(kafka.bootstrap, topic_name, 3000)
    s = settings(kafka.bootstrap, tmp_path, topic_name)
    first = tier_once(s)
    assert first.segments >= 2 and _objects(tmp_path / "tier")
    segs = tiered(s, topic_name)[0]
    keep = settings(kafka.bootstrap, tmp_path, topic_name, tier_topic_overrides={topic_name: {"retention.ms": 0}},
                    confirm_retention=True)
    assert tier_once(keep).expired == 0  # the broker still has it all: nothing is removed from the tier
    broker_forgets(kafka.bootstrap, topic_name, above=segs[-1].end_offset, retention_ms=500, restore_ms=None)
    # and the ticks it appended too (retention stays at 500 ms): the passes below have nothing new to copy
    wait_until(lambda: (w := watermarks(kafka.bootstrap, topic_name))[0] == w[1], "the broker to hold nothing",
               timeout=60, interval=0.2)
    sized = settings(kafka.bootstrap, tmp_path, topic_name,
                     tier_topic_overrides={topic_name: {"retention.bytes": segs[-1].segment_size_in_bytes,
                                                        "retention.ms": -1}}, confirm_retention=True)
    assert tier_once(sized).expired == len(segs) - 1  # by size: only the newest segment fits
    assert [m.segment_id for m in tiered(s, topic_name)[0]] == [segs[-1].segment_id]
    assert tier_once(keep).expired == 1  # by time: everything is older than 0 ms
    assert tiered(s, topic_name)[0] == [] and _objects(tmp_path / "tier") == []

    set_retention(kafka.bootstrap, topic_name, 3_600_000)
    _fill(kafka.bootstrap, topic_name, 1000)
    assert tier_once(s).segments >= 1
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    admin.delete_topics([topic_name])[topic_name].result(30)
    wait_until(lambda: topic_name not in admin.list_topics(timeout=5).topics, "the topic to be gone")
    # proven gone (UNKNOWN_TOPIC_ID for its id); the whole tier, so only with --confirm-retention
    assert tier_once(s).partitions_deleted == 0 and tiered(s, topic_name)[0]
    gone = settings(kafka.bootstrap, tmp_path, topic_name, tier_topic_delete_delay_ms=0, confirm_retention=True)
    summary = tier_once(gone)
    assert summary.partitions_deleted == 1
    assert _objects(tmp_path / "tier") == []

    async def state() -> tuple[int, set[bytes]]:
        r = FileRLMM(tmp_path / "meta")
        await r.start()
        finished = [d for d in r.cache.deletions.values() if d.tp.topic == topic_name]
        return int(finished[0].state), {k for keys in r.keys.values() for k in keys}

    deletion_state, live_keys = asyncio.run(state())
    assert deletion_state == 2  # DELETE_PARTITION_FINISHED
    assert len(live_keys) == 1 and next(iter(live_keys)).count(b":") == 1  # only the partition marker key


def test_gap_alarm_when_retention_outruns_tiering(kafka: KafkaCluster, tmp_path: Path, topic_name: str) -> None:
    create_topic(kafka.bootstrap, topic_name, config=small_segments(64 * 1024))
    _fill(kafka.bootstrap, topic_name, 500)
    s = settings(kafka.bootstrap, tmp_path, topic_name)
    assert tier_once(s).segments >= 1
    tiered_end = tiered(s, topic_name)[0][-1].end_offset
    _fill(kafka.bootstrap, topic_name, 1000)  # more data, in several broker segments
    log_start = broker_forgets(kafka.bootstrap, topic_name, above=tiered_end + 1, retention_ms=500)
    assert log_start > tiered_end + 1
    s = settings(kafka.bootstrap, tmp_path, topic_name, tier_topic_overrides={topic_name: {"retention.ms": -1}})
    summary = tier_once(s)
    assert summary.segments >= 1, summary
    assert summary.gaps == [{"topic": topic_name, "partition": 0, "first_missing": tiered_end + 1,
                             "last_missing": log_start - 1}]
    gaps = json.loads((tmp_path / "state" / "gaps.json").read_text())
    assert gaps == summary.gaps
    segs, _, _ = tiered(s, topic_name)
    # the gap stays visible: nothing tiered between the first pass's end and the broker's new log start (the first
    # pass may have tiered one segment or more)
    below = [m for m in segs if m.start_offset <= tiered_end]
    above = [m for m in segs if m.start_offset > tiered_end]
    assert max(m.end_offset for m in below) == tiered_end
    assert above and min(m.start_offset for m in above) >= log_start


def test_remote_retention_stops_at_the_first_segment_it_keeps(kafka: KafkaCluster, tmp_path: Path,
                                                              topic_name: str) -> None:
    """Timestamps need not grow with offsets: the older segment is recent, the newer one is two days old. With
    retention.ms one day, Kafka's deletableSegments stops at the first segment kept: nothing is deleted, no hole
    is cut behind it. With retention.ms 0 both go, oldest first."""
    create_topic(kafka.bootstrap, topic_name, config={"segment.ms": "2000", "message.timestamp.type": "CreateTime",
                                                      "message.timestamp.before.max.ms": str(7 * 86_400_000)})
    p = Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 5})
    now = int(time.time() * 1000)
    for i in range(800):
        ts = now if i < 400 else now - 2 * 86_400_000  # the second half carries old timestamps
        p.produce(topic_name, os.urandom(200), f"k{i}".encode(), timestamp=ts)
        if i == 399:
            p.flush(30)
    p.flush(30)
    # tier segments of ~16 KiB (70-100 records): the first within the recent half, the last within the old one
    s = settings(kafka.bootstrap, tmp_path, topic_name, tier_segment_bytes=16 * 1024)
    assert tier_once(s).failed == 0
    segs = tiered(s, topic_name)[0]
    assert len(segs) >= 2 and segs[0].max_timestamp_ms >= now and segs[-1].max_timestamp_ms < now - 86_400_000
    broker_forgets(kafka.bootstrap, topic_name, above=segs[-1].end_offset)
    day = settings(kafka.bootstrap, tmp_path, topic_name,
                   tier_topic_overrides={topic_name: {"retention.ms": 86_400_000}})
    assert tier_once(day).expired == 0  # (this pass may tier the broker's ticks too: newer segments)
    assert [m.segment_id for m in tiered(s, topic_name)[0]][:len(segs)] == [m.segment_id for m in segs]
    zero = settings(kafka.bootstrap, tmp_path, topic_name, tier_topic_overrides={topic_name: {"retention.ms": 0}},
                    confirm_retention=True)
    assert tier_once(zero).expired >= len(segs)
    left = {m.segment_id for m in tiered(s, topic_name)[0]}
    assert not left & {m.segment_id for m in segs}
