"""Ten thousand partitions (issue 65, item 2): a `tier` pass over `TIERPROXY_BENCH_WIDE_TOPICS` topics of 100
partitions each (default 100: 10,000 partitions) on a broker of their own, with nothing new, then with 1 % of the
partitions given closed segments to copy; each pass's wall time and what it reports (its requests, its snapshot).

    pytest -m bench tests/bench/test_wide_pass_bench.py -s
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from tests.bench.report import report
from tests.support.kafka import small_segment_producer, small_segments
from tests.support.tiering import tier_once
from tierproxy.config import TierSettings
from tierproxy.dev.kafkadist import KafkaCluster

pytestmark = [pytest.mark.bench, pytest.mark.kafka, pytest.mark.cluster, pytest.mark.spark]

TOPICS = int(os.environ.get("TIERPROXY_BENCH_WIDE_TOPICS", "100"))
PER_TOPIC = 100


def test_a_pass_over_ten_thousand_partitions(tmp_path: Path) -> None:
    wide = KafkaCluster(1, workdir=tmp_path / "wide").start()
    try:
        admin = AdminClient({"bootstrap.servers": wide.bootstrap})
        names = [f"wide-{t:03d}" for t in range(TOPICS)]
        began = time.perf_counter()
        for chunk in range(0, TOPICS, 10):
            futures = admin.create_topics([NewTopic(n, PER_TOPIC, 1, config=small_segments())
                                           for n in names[chunk:chunk + 10]], operation_timeout=120)
            for f in futures.values():
                f.result(300)
        created_s = time.perf_counter() - began
        settings = TierSettings(bootstrap_servers=wide.bootstrap, tier_topics="wide-.*",
                                storage=f"file://{tmp_path / 'tier'}", metadata="topic:",
                                tier_segment_bytes=16 * 1024, spark_master="local[2]",
                                tier_state_dir=tmp_path / "state")
        passes = []
        for what in ("first", "nothing new"):
            began = time.perf_counter()
            s = tier_once(settings)
            passes.append((what, time.perf_counter() - began, s))
        prod = small_segment_producer(wide.bootstrap)
        changed = [(names[i % TOPICS], (i * 37) % PER_TOPIC) for i in range(TOPICS * PER_TOPIC // 100)]
        for topic, p in changed:
            for _ in range(60):  # ~60 kB: a few closed 16 kB segments
                prod.produce(topic, b"x" * 1000, partition=p)
            prod.poll(0)
        assert prod.flush(120) == 0
        began = time.perf_counter()
        s = tier_once(settings)
        passes.append(("1 % changed", time.perf_counter() - began, s))
        assert s.segments >= len(changed), s
    finally:
        wide.stop()
    report("tier pass, wide", f"{TOPICS * PER_TOPIC:,} partitions ({TOPICS} topics created in {created_s:.0f}s): " +
           "; ".join(f"{what} {secs:.1f}s ({s.segments} segments, storage {s.storage.get('requests')})"
                     for what, secs, s in passes))
