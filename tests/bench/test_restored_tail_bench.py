"""A restored topic's tail through the proxy, beside an ordinary topic's, same run, same cluster, same data: kcat
reads the records produced after the restore (from S) of the restored topic, and the same number of records of a
topic created in B, both through one proxy in front of B. The ratio is the result (1.0: the restore costs the
tail nothing).

    pytest -m bench tests/bench/test_restored_tail_bench.py -s    (TIERPROXY_BENCH_RECORDS, capped at 262,144)

Slow: a 3-broker cluster B (a restore refuses a single broker), a tier pass of the session broker (A), a restore.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer

from tests.bench.clients import produce
from tests.bench.conftest import BENCH_RECORDS, RECORD_SIZE
from tests.bench.report import busy_share, machine_ticks, report
from tests.support.cli import run_cli
from tests.support.kafka import create_topic, watermarks
from tests.support.proxy import ProxyProcess
from tests.support.tiering import settings, tier_once
from tierproxy.dev.kafkadist import KafkaCluster

pytestmark = [pytest.mark.bench, pytest.mark.kafka, pytest.mark.spark]
RECORDS = min(BENCH_RECORDS, 1 << 18)
ROUNDS = 3
HISTORY = 5000  # records of the restored topic's history (in the tier): S


@pytest.fixture(scope="module")
def restored(kafka: KafkaCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[KafkaCluster, Path]]:
    d = tmp_path_factory.mktemp("restored-tail")
    create_topic(kafka.bootstrap, "restored-history", config={"segment.bytes": str(1 << 20)})
    p = Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 20})
    for i in range(HISTORY):
        p.produce("restored-history", f"h-{i}".encode() * 20)
    assert p.flush(60) == 0
    s = settings(kafka.bootstrap, d, "restored-history", metadata="topic:")
    assert tier_once(s).segments > 0
    b = KafkaCluster(3, workdir=d / "b").start()
    try:
        run_cli("restore", "--bootstrap-server", b.bootstrap, "--storage", s.storage, "--metadata", s.metadata,
                "--topics", "restored-history", check=True)
        assert watermarks(b.bootstrap, "restored-history") == (HISTORY, HISTORY)
        # the restored topic's replication (max(2, A's 1)) and segment size (A's, recreated): Kafka answers a
        # fetch from one segment, so the segment size alone sets how much each fetch brings
        create_topic(b.bootstrap, "plain", 1, 2, config={"segment.bytes": str(1 << 20)})
        for topic in ("restored-history", "plain"):
            produce(b, topic, RECORDS, RECORD_SIZE)
        yield b, d
    finally:
        b.stop()


def _kcat_seconds(kcat: str, bootstrap: str, topic: str, start: int) -> float:
    t0 = time.perf_counter()
    out = subprocess.run([kcat, "-b", bootstrap, "-C", "-t", topic, "-p", "0", "-o", str(start), "-c", str(RECORDS),
                          "-q", "-f", "%o\n", "-X", "fetch.message.max.bytes=4194304"],
                         capture_output=True, timeout=600, check=True)
    took = time.perf_counter() - t0
    assert [int(x) for x in out.stdout.split()[:1]] == [start] and out.stdout.count(b"\n") == RECORDS
    return took


def test_a_restored_topics_tail_reads_as_fast_as_any_topics(restored: tuple[KafkaCluster, Path], kcat: str) -> None:
    b, d = restored
    proxy = ProxyProcess(b.bootstrap, d, extra={"TIERPROXY_STORAGE": f"file://{d}/tier",
                                                          "TIERPROXY_METADATA": "topic:"})
    try:
        sides = {"restored": ("restored-history", HISTORY, proxy.bootstrap), "plain": ("plain", 0, proxy.bootstrap),
                 "restored direct": ("restored-history", HISTORY, b.bootstrap),
                 "plain direct": ("plain", 0, b.bootstrap)}
        times: dict[str, list[float]] = {side: [] for side in sides}
        busy: dict[str, list[float]] = {side: [] for side in sides}
        for _ in range(ROUNDS):  # alternate so drift hits every side alike
            for side, (topic, start, bootstrap) in sides.items():
                t0 = machine_ticks()
                times[side].append(_kcat_seconds(kcat, bootstrap, topic, start))
                busy[side].append(busy_share(t0, machine_ticks()))
    finally:
        proxy.stop()
    mb = RECORDS * RECORD_SIZE / 1e6
    rate = {side: mb / min(t) for side, t in times.items()}
    r, p = rate["restored"], rate["plain"]
    report("restored topic's tail (kcat)", f"{RECORDS} records of {RECORD_SIZE} B through tierproxy in front of B: "
           f"restored topic from S {r:.0f} MB/s, a topic created in B {p:.0f} MB/s, ratio {r / p:.2f}x; directly "
           f"at B {rate['restored direct']:.0f} / {rate['plain direct']:.0f} MB/s (through tierproxy / direct: "
           f"{r / rate['restored direct']:.2f}x / {p / rate['plain direct']:.2f}x); best of {ROUNDS}; all "
           f"{os.cpu_count()} cores busy {max(busy['restored']):.0%} / {max(busy['plain']):.0%}")
    assert r / p > 0.3  # a sanity floor; the figure itself is the result
