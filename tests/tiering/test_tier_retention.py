"""The tier's own retention (`tier.retention.ms` / `tier.retention.bytes`, default -1: keep forever). The broker
topic's `retention.*` is the local retention: whatever the broker deletes, and however its settings flip, the tier
keeps every tiered record; only the tier's retention deletes, by its own value, and never more than
`tier.retention.max.delete.fraction` of a partition at once unless confirmed."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from tests.support.fetchraw import fetch_raw
from tests.support.kafka import create_topic, set_topic_config, watermarks
from tests.support.proxy import ProxyProcess
from tests.support.tiering import offsets_of, settings, tier_once, tiered
from tests.support.waiting import proxy_serves_tier, wait_until
from tierproxy.dev.kafkadist import KafkaCluster

pytestmark = [pytest.mark.kafka, pytest.mark.spark]
HOUR = 3_600_000


def _fill(bootstrap: str, topic: str, ages_ms: list[int], per_age: int = 700) -> None:
    """`per_age` records of 200 bytes for each age (CreateTime now - age), in small batches."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "batch.size": 16384})
    now = int(time.time() * 1000)
    for age in ages_ms:
        for i in range(per_age):
            p.produce(topic, os.urandom(200), f"k{i}".encode(), timestamp=now - age)
        p.flush(60)


def _broker_deletes(bootstrap: str, topic: str, key: str, value: str) -> int:
    """Set the broker's (local) retention and wait until it has deleted the start of the log."""
    set_topic_config(bootstrap, topic, key, value)
    p = Producer({"bootstrap.servers": bootstrap})
    deadline = time.monotonic() + 60
    while watermarks(bootstrap, topic)[0] == 0 and time.monotonic() < deadline:
        p.produce(topic, b"tick")  # rolls the active segment so retention can delete it
        p.flush(5)
        time.sleep(0.3)
    start = watermarks(bootstrap, topic)[0]
    assert start > 0, f"the broker kept {topic} whole"
    return start


def _topic(kafka: KafkaCluster, name: str, ages: list[int]) -> None:
    create_topic(kafka.bootstrap, name, config={"segment.ms": "500", "message.timestamp.type": "CreateTime",
                                                "retention.ms": "-1",  # until tiered: then the test sets it
                                                "message.timestamp.before.max.ms": str(30 * 24 * HOUR)})
    _fill(kafka.bootstrap, name, ages)


def test_broker_retention_never_deletes_the_tier_and_tier_retention_deletes_by_its_own_value(
        kafka: KafkaCluster, tmp_path: Path, topic_name: str) -> None:
    hourly, weekly = f"{topic_name}-1h", f"{topic_name}-7d"
    _topic(kafka, hourly, [3 * HOUR, 2 * HOUR, 2 * HOUR])
    _topic(kafka, weekly, [8 * 24 * HOUR])
    both = f"({hourly}|{weekly})"
    s = settings(kafka.bootstrap, tmp_path, hourly, tier_topics=both)
    assert tier_once(s).segments >= 6
    before = {t: tiered(s, t)[0] for t in (hourly, weekly)}
    assert before[hourly][0].start_offset == 0 and before[weekly][0].start_offset == 0

    # the brokers delete by their own (local) retention: 1 hour, 7 days (Kafka's default)
    _broker_deletes(kafka.bootstrap, hourly, "retention.ms", str(HOUR))
    _broker_deletes(kafka.bootstrap, weekly, "retention.ms", str(7 * 24 * HOUR))
    for _ in range(2):
        summary = tier_once(s)
        assert (summary.expired, summary.purged, summary.gaps) == (0, 0, []), summary
    for t in (hourly, weekly):
        assert tiered(s, t)[0][:len(before[t])] == before[t]  # every tiered record kept

    # while the broker keeps one byte of the weekly topic, a pass deletes nothing from the tier either
    _broker_deletes(kafka.bootstrap, weekly, "retention.bytes", "1")
    assert tier_once(s).expired == 0
    assert tiered(s, weekly)[0][:len(before[weekly])] == before[weekly]

    # the tier's retention for one topic: 2.5 hours deletes the 3-hour-old third of the hourly topic, nothing else
    per_topic = settings(kafka.bootstrap, tmp_path, hourly, tier_topics=both,
                         tier_topic_overrides={hourly: {"retention.ms": int(2.5 * HOUR)}})
    summary = tier_once(per_topic)
    cutoff = int(time.time() * 1000) - int(2.5 * HOUR)
    old = [m for m in before[hourly] if m.max_timestamp_ms < cutoff]
    assert old and summary.expired == len(old) and summary.retention_refused == []
    assert tiered(s, hourly)[0][0].start_offset == old[-1].end_offset + 1
    assert tiered(s, weekly)[0][:len(before[weekly])] == before[weekly]

    # a tier.retention.bytes that would delete 90% of a partition at once is refused, unless confirmed
    total = sum(m.segment_size_in_bytes for m in tiered(s, weekly)[0])
    cmd = [sys.executable, "-m", "tierproxy.cli", "tier", "--once", "--no-progress", "--bootstrap-server",
           kafka.bootstrap, "--storage", s.storage, "--metadata", str(s.metadata), "--topics", weekly]
    env = {**os.environ, "TIERPROXY_TIER_RETENTION_BYTES": str(total // 10), "TIERPROXY_SPARK_MASTER": "local[1]",
           "TIERPROXY_TIER_STATE_DIR": str(tmp_path / "state")}
    refused = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert refused.returncode == 5, refused.stderr[-2000:]
    assert f"RETENTION REFUSED {weekly}-0" in refused.stdout and "--confirm-retention" in refused.stdout
    assert tiered(s, weekly)[0][:len(before[weekly])] == before[weekly]
    confirmed = subprocess.run([*cmd, "--confirm-retention"], env=env, capture_output=True, text=True, timeout=300)
    assert confirmed.returncode == 0, confirmed.stderr[-2000:]
    kept = tiered(s, weekly)[0]
    assert kept and sum(m.segment_size_in_bytes for m in kept) <= total // 10 + kept[0].segment_size_in_bytes
    assert len(kept) < len(before[weekly])


def test_a_retention_flip_on_the_broker_loses_nothing(kafka: KafkaCluster, tmp_path: Path, topic_name: str) -> None:
    """retention -1/-1, then retention.bytes=1 until the broker has deleted, then -1 again, then two passes: every
    tiered record is still served through the proxy from offset 0 (on main before the fix, the pass took the
    moved log start for a purge and deleted the tier)."""
    create_topic(kafka.bootstrap, topic_name, config={"retention.ms": "-1", "retention.bytes": "-1",
                                                      "segment.ms": "500"})
    _fill(kafka.bootstrap, topic_name, [0], per_age=3000)
    expected, _ = fetch_raw(kafka.bootstrap, topic_name)
    s = settings(kafka.bootstrap, tmp_path, topic_name)
    assert tier_once(s).segments >= 4
    log_start = _broker_deletes(kafka.bootstrap, topic_name, "retention.bytes", "1")
    set_topic_config(kafka.bootstrap, topic_name, "retention.bytes", "-1")
    assert log_start >= len(offsets_of(expected)) - 1
    for _ in range(2):
        summary = tier_once(s)
        assert (summary.expired, summary.purged) == (0, 0), summary
    served, _ = tiered(s, topic_name)[1], None
    assert served.startswith(expected[:len(served)]) and len(offsets_of(served)) >= 3000 - 1

    proxy = ProxyProcess(kafka.bootstrap, tmp_path, {"TIERPROXY_STORAGE": s.storage,
                                                      "TIERPROXY_METADATA": str(s.metadata)})
    try:
        wait_until(lambda: proxy_serves_tier(proxy.bootstrap, topic_name), "the proxy's tier", timeout=60)
        c = Consumer({"bootstrap.servers": proxy.bootstrap, "group.id": f"flip-{time.monotonic_ns()}",
                      "enable.auto.commit": False})
        c.assign([TopicPartition(topic_name, 0, 0)])
        got = []
        deadline = time.monotonic() + 60
        while len(got) < 3000 and time.monotonic() < deadline:
            for m in c.consume(500, 1.0):
                assert m.error() is None, m.error()
                got.append(m.offset())
        c.close()
        assert got[:3000] == list(range(3000))
    finally:
        proxy.stop()
