"""A topic leaves the tier only on proof (docs/tiering.md "What deletes history").

- A tier pass, a proxy and an Iceberg pass pointed at another cluster with the same tier and metadata refuse to
  start, naming both cluster ids; nothing is deleted and a proxy in front of the right cluster still serves every
  record (before: the other cluster's Metadata lacked every tiered topic id, and the pass deleted them all).
- A topic really deleted: the cluster answers UNKNOWN_TOPIC_ID for its id; it leaves the tier once that has held
  for tier.topic.delete.delay.ms, and only within the deletion guard (the whole tier needs --confirm-retention).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from tests.support.kafka import broker_forgets, create_topic, small_segment_producer, small_segments, watermarks
from tests.support.proxy import ProxyProcess
from tests.support.tiering import offsets_of, settings, tier_once, tiered
from tests.support.waiting import wait_until
from tierproxy.config import ProxySettings, TierSettings
from tierproxy.dev.kafkadist import KafkaCluster
from tierproxy.remote.service import RemoteTier

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.kcat]
RECORDS = 3000


def _produce(bootstrap: str, topic: str) -> None:
    # several broker segments; segment.ms lets the ticks of `broker_forgets` roll the last one
    create_topic(bootstrap, topic, config={**small_segments(16 * 1024), "segment.ms": "300"})
    p = small_segment_producer(bootstrap)
    for i in range(RECORDS):
        p.produce(topic, f"v{i}".encode() * 10, f"k{i}".encode())
    assert p.flush(30) == 0
    assert watermarks(bootstrap, topic)[1] == RECORDS, "the broker refused records"


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tierproxy.cli", *args], capture_output=True, text=True,
                          timeout=240, env={**os.environ, **(env or {})})


def _kcat_offsets(kcat: str, bootstrap: str, topic: str) -> list[int]:
    out = subprocess.run([kcat, "-b", bootstrap, "-C", "-t", topic, "-p", "0", "-o", "beginning", "-e", "-q",
                          "-f", "%o\n"], capture_output=True, text=True, timeout=120)
    return [int(x) for x in out.stdout.split()]


def test_tier_serve_and_iceberg_against_another_cluster_refuse_and_delete_nothing(
        kafka: KafkaCluster, tmp_path: Path, topic_name: str, kcat: str) -> None:
    _produce(kafka.bootstrap, topic_name)
    s = settings(kafka.bootstrap, tmp_path, topic_name)
    assert tier_once(s).segments >= 2
    before = tiered(s, topic_name)
    log_start = broker_forgets(kafka.bootstrap, topic_name, above=RECORDS)
    hw = watermarks(kafka.bootstrap, topic_name)[1]
    assert log_start >= RECORDS  # the tier is now the only copy of the first 3000 records

    other = KafkaCluster(1, workdir=tmp_path / "other").start()
    try:
        common = ["--bootstrap-server", other.bootstrap, "--storage", s.storage, "--metadata", str(s.metadata)]
        # as an operator would: a typo in the bootstrap; nothing else differs (delay 0, deletions confirmed)
        env = {"TIERPROXY_TIER_STATE_DIR": str(tmp_path / "state"), "TIERPROXY_TIER_TOPIC_DELETE_DELAY_MS": "0"}
        runs = {"tier": _cli("tier", "--once", "--no-progress", "--confirm-retention", *common, env=env),
                "serve": _cli("serve", "--listen", "127.0.0.1:0", *common),
                "iceberg": _cli("iceberg", "--once", *common, env=env)}
        # a proxy whose brokers could not be asked at start checks again before its tier serves: never ready
        problem = asyncio.run(_remote_tier_problem(other.bootstrap, s))
        assert kafka.cluster_id in problem and other.cluster_id in problem, problem
    finally:
        other.stop()
    for name, run in runs.items():
        lines = run.stderr.strip().splitlines()
        assert run.returncode == 2, (name, run.stderr[-2000:])
        assert kafka.cluster_id in lines[-1] and other.cluster_id in lines[-1], (name, lines[-1])
        assert "Traceback" not in run.stderr and "deleting partition" not in run.stderr + run.stdout

    assert tiered(s, topic_name) == before  # every segment, byte for byte
    proxy = ProxyProcess(kafka.bootstrap, tmp_path, extra={"TIERPROXY_STORAGE": s.storage,
                                                           "TIERPROXY_METADATA": str(s.metadata)})
    try:
        assert _kcat_offsets(kcat, proxy.bootstrap, topic_name) == list(range(RECORDS)) + list(range(log_start, hw))
    finally:
        proxy.stop()


async def _remote_tier_problem(bootstrap: str, s: TierSettings) -> str:
    tier = RemoteTier(ProxySettings(bootstrap_servers=bootstrap, storage=s.storage, metadata=str(s.metadata)))
    await tier.start()
    try:
        for _ in range(100):
            if tier.loading_problem is not None:
                break
            await asyncio.sleep(0.1)
        assert not tier.ready.is_set()  # nothing served from that tier
        return tier.loading_problem or ""
    finally:
        await tier.close()


def test_a_deleted_topic_leaves_the_tier_after_the_delay_and_within_the_guard(kafka: KafkaCluster, tmp_path: Path,
                                                                             topic_name: str) -> None:
    _produce(kafka.bootstrap, topic_name)
    s = settings(kafka.bootstrap, tmp_path, topic_name)
    assert tier_once(s).segments >= 2
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    admin.delete_topics([topic_name])[topic_name].result(30)
    wait_until(lambda: topic_name not in admin.list_topics(timeout=5).topics, "the topic to be gone")

    delayed = settings(kafka.bootstrap, tmp_path, topic_name, tier_topic_delete_delay_ms=2000,
                       confirm_retention=True)
    first = tier_once(delayed)  # proven gone, first seen now: kept for the delay
    first_seen = time.time()  # after the pass: its own "first seen" stamp is no later than this
    assert first.partitions_deleted == 0 and len(first.topics_pending_deletion) == 1, first
    assert topic_name in first.topics_pending_deletion[0]
    assert offsets_of(tiered(s, topic_name)[1]) == list(range(RECORDS))

    wait_until(lambda: time.time() > first_seen + 2.0, "tier.topic.delete.delay.ms since the pass that first "
               "saw the topic gone", timeout=10)
    guarded = settings(kafka.bootstrap, tmp_path, topic_name, tier_topic_delete_delay_ms=2000)
    refused = tier_once(guarded)  # due, but it is the whole tier: refused without --confirm-retention
    assert refused.partitions_deleted == 0 and len(refused.retention_refused) == 1, refused
    assert "deleted topics" in refused.retention_refused[0]
    assert offsets_of(tiered(s, topic_name)[1]) == list(range(RECORDS))

    done = tier_once(delayed)
    assert done.partitions_deleted == 1 and not done.topics_pending_deletion, done
    assert tiered(s, topic_name)[0] == []
