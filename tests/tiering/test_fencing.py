"""Two tier jobs at once are fenced (O item 10): on the metadata topic the second job's transactional producer
fences the first, whose next write fails and stops it with nothing half-written; on a metadata directory the
second job refuses to start while the first holds it. `tierproxy tier` exits 4 with the reason."""

from __future__ import annotations

import itertools
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import Producer

from tests.support.kafka import create_topic
from tests.support.spark import worker_session
from tests.support.tiering import offsets_of, settings, tiered
from tierproxy.dev.kafkadist import KafkaCluster
from tierproxy.jobs.tiering.job import TieringJob
from tierproxy.tier.rlmm import WriterFenced

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


def _produce(bootstrap: str, topic: str, first: int, n: int) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(first, first + n):
        p.produce(topic, f"v{i}".encode() * 20)
        if i % 100 == 99:
            p.flush(10)
    p.flush(30)


def test_a_second_job_on_the_metadata_topic_fences_the_first(kafka: KafkaCluster, tmp_path: Path,
                                                             topic_name: str) -> None:
    create_topic(kafka.bootstrap, topic_name)
    _produce(kafka.bootstrap, topic_name, 0, 1000)
    meta = f"topic:__tierproxy_meta_{topic_name}?partitions=2&replication=1"
    s = settings(kafka.bootstrap, tmp_path, topic_name, metadata=meta, tier_segment_bytes=8 * 1024)
    first, second = TieringJob(s, progress=False, spark=worker_session()), None
    try:
        assert first.run_once().segments > 0
        _produce(kafka.bootstrap, topic_name, 1000, 1000)
        second = TieringJob(s, progress=False, spark=worker_session())
        assert second.run_once().segments > 0  # took over: copies 1000.. and fences the first
        _produce(kafka.bootstrap, topic_name, 2000, 1000)
        with pytest.raises(WriterFenced, match="another tier job took over"):
            first.run_once()
        assert second.run_once().segments > 0  # the second goes on
    finally:
        first.close()
        if second is not None:
            second.close()
    segs, raw, _ = tiered(s, topic_name)
    assert offsets_of(raw) == list(range(3000))  # every offset once: the fenced pass left nothing behind
    assert all(a.end_offset < b.start_offset for a, b in itertools.pairwise(segs))


def test_a_second_job_on_a_metadata_directory_refuses_to_start(kafka: KafkaCluster, tmp_path: Path,
                                                               topic_name: str) -> None:
    create_topic(kafka.bootstrap, topic_name)
    _produce(kafka.bootstrap, topic_name, 0, 500)
    s = settings(kafka.bootstrap, tmp_path, topic_name)
    first = TieringJob(s, progress=False, spark=worker_session())
    try:
        assert first.run_once().segments > 0  # holds the directory from now until it closes
        started = time.monotonic()
        out = subprocess.run([sys.executable, "-m", "tierproxy.cli", "tier", "--once", "--no-progress",
                              "--bootstrap-server", kafka.bootstrap, "--storage", s.storage, "--metadata",
                              str(s.metadata), "--topics", s.tier_topics], capture_output=True, text=True,
                             timeout=120)
        assert out.returncode == 4, out.stderr[-2000:]
        assert "another tier job holds" in out.stderr and "writer.lock" in out.stderr
        assert time.monotonic() - started < 60
    finally:
        first.close()
    again = TieringJob(s, progress=False, spark=worker_session())  # the lock went with the first job
    try:
        _produce(kafka.bootstrap, topic_name, 500, 10)
        assert again.run_once().failed == 0
    finally:
        again.close()
