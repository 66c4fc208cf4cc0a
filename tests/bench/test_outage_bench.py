"""Tail readers while S3 is slow (5 s per request) or down: tail fetch p99 and throughput through the proxy,
against the same tail fetches with S3 healthy, in the same run. Remote readers run in separate processes (so
the measurement is the proxy's, not this process's GIL). Goal: tail within 10%.

    pytest -m bench tests/bench/test_outage_bench.py -s
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.bench.report import report
from tests.support.kafka import watermarks
from tests.support.proxy import ProxyProcess
from tests.support.relay import DelayRelay
from tests.support.remote import tier_to_s3_and_forget, timed_fetch
from tests.support.s3 import S3Server
from tests.support.waiting import wait_until
from tierproxy.dev.kafkadist import KafkaCluster

pytestmark = [pytest.mark.bench, pytest.mark.kafka, pytest.mark.spark, pytest.mark.s3]
# a remote reader: once its imports are done it says so (creates the file argv[4]) and fetches for argv[3] seconds
LOADER = ("import sys, time\nfrom tests.support.remote import timed_fetch\n"
          "open(sys.argv[4], 'w').close()\nend = time.monotonic() + float(sys.argv[3])\n"
          "while time.monotonic() < end:\n    timed_fetch(sys.argv[1], sys.argv[2], 0)\n")


def _tail(address: str, topic: str, offset: int, seconds: float) -> tuple[float, float]:
    """(p99 seconds, fetches per second) of back-to-back tail fetches for `seconds`."""
    lat = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        took, part = timed_fetch(address, topic, offset)
        assert part["error_code"] == 0
        lat.append(took)
    lat.sort()
    return lat[int(len(lat) * 0.99) - 1], len(lat) / seconds


def _remote_readers(address: str, topic: str, marks: list[Path]) -> list[subprocess.Popen[bytes]]:
    """A remote reader per file in `marks`, each fetching for 12 s, once every one has started fetching: the tail is
    measured beside readers that fetch, not beside interpreters still importing."""
    readers = [subprocess.Popen([sys.executable, "-c", LOADER, address, topic, "12", str(m)]) for m in marks]
    wait_until(lambda: all(m.exists() or r.poll() is not None for m, r in zip(marks, readers, strict=True)),
               "the remote readers fetching", timeout=60)
    assert all(m.exists() for m in marks), "a remote reader exited before it fetched"
    return readers


def test_tail_reads_while_s3_is_slow_or_down(kafka: KafkaCluster, s3: S3Server, tmp_path: Path) -> None:
    topic = "bench-outage"
    tier_to_s3_and_forget(kafka, s3, tmp_path, topic)
    relay = DelayRelay(int(s3.endpoint.rsplit(":", 1)[1]), delay=0.0)
    proxy = ProxyProcess(kafka.bootstrap, tmp_path, extra={
        "TIERPROXY_STORAGE": f"s3://tier/p?endpoint=http://127.0.0.1:{relay.port}&region={s3.region}",
        "TIERPROXY_METADATA": f"file://{tmp_path}/meta", "TIERPROXY_REMOTE_FETCH_CACHE_BYTES": "0",
        "AWS_ACCESS_KEY_ID": s3.access_key, "AWS_SECRET_ACCESS_KEY": s3.secret_key})
    address = f"127.0.0.1:{proxy.base + 1}"
    hw = watermarks(kafka.bootstrap, topic)[1]
    figures = []
    try:
        proxy.wait_tier_ready()
        for k, phase in enumerate(("no remote readers", "healthy", "5 s latency", "down")):
            if phase == "5 s latency":
                relay.delay = 5.0
            if phase == "down":
                s3.proc.kill()
                s3.proc.wait(10)
            n = 0 if phase == "no remote readers" else 4
            loaders = _remote_readers(address, topic, [tmp_path / f"reader-{k}-{i}" for i in range(n)])
            p99, rate = _tail(address, topic, hw - 1, 8)
            for lp in loaders:
                lp.wait(30)
            figures.append((phase, p99, rate))
    finally:
        proxy.stop()
        relay.close()
    base = figures[0]
    report("tail reads under S3 trouble (4 remote readers in every phase but the first)", "; ".join(
        f"{name}: p99 {p99 * 1e3:.2f} ms ({p99 / base[1]:.2f}x), {rate:.0f} fetches/s ({rate / base[2]:.2f}x)"
        for name, p99, rate in figures))
