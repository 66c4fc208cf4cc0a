"""A restore of many partitions, end to end: the session broker's topic of `TIERPROXY_BENCH_RESTORE_PARTITIONS`
partitions (default 100) tiered, then restored into a new 3-broker cluster: the restore's wall time, its leader moves
(the epoch raise), its fill rate, and each phase as the restore reports it.

    pytest -m bench tests/bench/test_restore_wide_bench.py -s
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest

from tests.bench.report import report
from tests.support.cli import run_cli
from tests.support.kafka import create_topic, small_segment_producer, small_segments
from tests.support.restore import tier_settings
from tests.support.tiering import tier_once
from tierproxy.dev.kafkadist import KafkaCluster
from tierproxy.jobs.restore.epochs import partition_state

pytestmark = [pytest.mark.bench, pytest.mark.kafka, pytest.mark.cluster, pytest.mark.spark]

PARTITIONS = int(os.environ.get("TIERPROXY_BENCH_RESTORE_PARTITIONS", "100"))
RECORDS = 200  # per partition: a few small segments each


def test_a_restore_of_many_partitions(kafka: KafkaCluster, tmp_path: Path) -> None:
    topic = f"wide-{time.monotonic_ns() % 100000}"
    create_topic(kafka.bootstrap, topic, PARTITIONS, 1, small_segments())
    prod = small_segment_producer(kafka.bootstrap)
    for i in range(RECORDS * PARTITIONS):
        prod.produce(topic, f"v-{i}-{'x' * 200}".encode(), partition=i % PARTITIONS)
    prod.flush(60)
    tier = tmp_path / "tier"
    settings = tier_settings(kafka.bootstrap, tier, tmp_path / "state")
    settings = settings.model_copy(update={"tier_topics": topic})
    began = time.perf_counter()
    summary = tier_once(settings)
    tier_s = time.perf_counter() - began
    assert summary.segments >= PARTITIONS and summary.snapshot, summary
    b = KafkaCluster(3, workdir=tmp_path / "b").start()
    try:
        began = time.perf_counter()
        out = run_cli("restore", "--bootstrap-server", b.bootstrap, "--storage", f"file://{tier}", "--metadata",
                      "topic:", "--topics", topic, check=True)
        restore_s = time.perf_counter() - began
        assert f"restored {PARTITIONS} partitions" in out.stdout, out.stdout + out.stderr
        state = partition_state(b.bootstrap, [topic], None)
        assert len(state) == PARTITIONS and all(s[1] > 0 for s in state.values())
    finally:
        b.stop()
    fill = re.search(r"filled (\d+) offsets in ([\d.]+)s \(([\d,]+) offsets/s.*?; (\d+) leader moves", out.stdout)
    assert fill, out.stdout
    report("restore, wide", f"{PARTITIONS} partitions ({RECORDS} records each, {summary.segments} segments; tier "
           f"pass {tier_s:.1f}s): restore {restore_s:.1f}s wall, {fill.group(4)} leader moves, filled "
           f"{fill.group(1)} offsets in {fill.group(2)}s ({fill.group(3)} offsets/s)")
