"""A remote answer against the broker's own (issue 65, item 4): 1 KiB records read by kcat from offset 0 directly
while the broker holds them (5 rounds), then, once the broker deleted them, through a fresh proxy from the
filesystem tier (a first read, then 5 rounds); medians, and the proxy's CPU. With `TIERPROXY_BENCH_PYSPY` naming a
py-spy binary, the proxy is sampled during the rounds and its hottest frames reported (where the time goes).

    pytest -m bench tests/bench/test_remote_fetch_bench.py -s    (TIERPROXY_BENCH_REMOTE_SIZE=200: 200 B records)
"""

from __future__ import annotations

import os
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.bench.clients import RECORDS, kcat_mbps, produce, served_from_file_tier
from tests.bench.report import cpu_seconds, report
from tests.support.kafka import create_topic
from tierproxy.dev.kafkadist import KafkaCluster

pytestmark = [pytest.mark.bench, pytest.mark.kafka, pytest.mark.spark, pytest.mark.kcat]
ROUNDS = 5
SIZE = int(os.environ.get("TIERPROXY_BENCH_REMOTE_SIZE", "1024"))  # bytes a record (200: the small-record run)


def _hottest(raw: Path, n: int = 6) -> str:
    """The frames py-spy saw most often at the top of the stack, as shares of its samples."""
    leaf: Counter[str] = Counter()
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if stack:
            leaf[stack.split(";")[-1]] += int(count)
    total = sum(leaf.values()) or 1
    return ", ".join(f"{frame} {count * 100 / total:.0f} %" for frame, count in leaf.most_common(n))


def test_a_remote_catch_up_against_the_direct_tail(kafka: KafkaCluster, kcat: str, tmp_path: Path) -> None:
    topic = f"bench-fetch-{time.monotonic_ns() % 100000}"
    create_topic(kafka.bootstrap, topic, config={"segment.bytes": str(32 << 20)})
    produce(kafka, topic, RECORDS, SIZE)
    direct = sorted(kcat_mbps(kcat, kafka.bootstrap, topic, RECORDS, SIZE) for _ in range(ROUNDS))
    proxy, _ = served_from_file_tier(kafka, topic, tmp_path, "tier", RECORDS)
    spy, raw = None, tmp_path / "pyspy.txt"
    try:
        first = kcat_mbps(kcat, proxy.bootstrap, topic, RECORDS, SIZE)  # a fresh proxy: every chunk from the tier
        if pyspy := os.environ.get("TIERPROXY_BENCH_PYSPY"):
            spy = subprocess.Popen([pyspy, "record", "--pid", str(proxy.proc.pid), "--rate", "1000", "--format",
                                    "raw", "-o", str(raw), "--nonblocking"], stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)
        c0, t0 = cpu_seconds(proxy.proc.pid), time.perf_counter()
        remote = sorted(kcat_mbps(kcat, proxy.bootstrap, topic, RECORDS, SIZE) for _ in range(ROUNDS))
        busy = (cpu_seconds(proxy.proc.pid) - c0) / (time.perf_counter() - t0)
    finally:
        if spy is not None:
            spy.send_signal(2)  # py-spy writes what it sampled on SIGINT
            spy.wait(60)
        proxy.stop()
    d, r = direct[ROUNDS // 2], remote[ROUNDS // 2]
    profile = f"; the proxy's hottest frames: {_hottest(raw)}" if raw.exists() else ""
    report(f"remote fetch vs direct tail, {SIZE} B records", (
        f"direct {d:.0f} MB/s (median of {ROUNDS}: {', '.join(f'{x:.0f}' for x in direct)}), remote from the "
        f"filesystem tier {r:.0f} MB/s ({', '.join(f'{x:.0f}' for x in remote)}; a fresh proxy's first read "
        f"{first:.0f}) = {r / d:.2f}x; proxy {busy:.2f} cores busy{profile}"))
    assert r > 0
