"""Pass-through benchmark, same run, same data: consume throughput through tierproxy / direct with kcat and
kafka-consumer-perf-test, and the fetch latency the proxy adds (p50/p99).

    make bench                       # or: pytest -m bench tests/bench/test_proxy_bench.py -s
    TIERPROXY_BENCH_RECORDS=65536    # a smaller topic for a quick look
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

import pytest

from protocol.requests import fetch_request
from tests.bench.clients import kcat_seconds, perf_test_seconds
from tests.bench.conftest import BENCH_RECORDS, RECORD_SIZE
from tests.bench.report import busy_share, cpu_seconds, machine_ticks, report
from tests.support.proxy import ProxyProcess
from tierproxy.dev.kafkadist import KafkaCluster
from tierproxy.kafka.wireclient import WireClient

pytestmark = [pytest.mark.bench, pytest.mark.kafka]
ROUNDS = 2


@pytest.fixture(scope="module")
def bench_proxy(kafka: KafkaCluster, tmp_path_factory: pytest.TempPathFactory) -> ProxyProcess:
    p = ProxyProcess(kafka.bootstrap, tmp_path_factory.mktemp("bench-proxy"))
    yield p  # type: ignore[misc]
    p.stop()


def test_cpu_cost_per_gb_on_the_tail(kafka: KafkaCluster, bench_proxy: ProxyProcess, bench_topic: str,
                                     kcat: str) -> None:
    """Core-seconds per GB kcat reads: the proxy's, beside the broker's own for the same data (direct and proxied
    runs), same run."""
    broker = kafka.nodes[0].proc
    assert broker is not None
    gb = BENCH_RECORDS * RECORD_SIZE / 1e9
    _kcat_seconds(kcat, kafka.bootstrap, bench_topic)  # warm-up: the log in the page cache for both runs
    b0 = cpu_seconds(broker.pid)
    _kcat_seconds(kcat, kafka.bootstrap, bench_topic)
    b1, p1 = cpu_seconds(broker.pid), cpu_seconds(bench_proxy.proc.pid)
    _kcat_seconds(kcat, bench_proxy.bootstrap, bench_topic)
    b2, p2 = cpu_seconds(broker.pid), cpu_seconds(bench_proxy.proc.pid)
    report("cpu per GB (kcat, tail)", f"broker {(b1 - b0) / gb:.2f} core-s/GB direct, {(b2 - b1) / gb:.2f} proxied; "
                                      f"proxy {(p2 - p1) / gb:.2f} core-s/GB")
    assert p2 > p1  # the proxy did the relaying


def _kcat_seconds(kcat: str, bootstrap: str, topic: str) -> float:
    return kcat_seconds(kcat, bootstrap, topic, BENCH_RECORDS)


def _perf_test_seconds(kafka: KafkaCluster, bootstrap: str, topic: str) -> float:
    return perf_test_seconds(kafka, bootstrap, topic, BENCH_RECORDS)


def _compare(name: str, run: object) -> float:
    direct, proxied = [], []
    busy: dict[str, list[float]] = {"direct": [], "proxy": []}
    for _ in range(ROUNDS):  # alternate so drift hits both sides alike
        for side, times in (("direct", direct), ("proxy", proxied)):
            t0 = machine_ticks()
            times.append(run(side))  # type: ignore[operator]
            busy[side].append(busy_share(t0, machine_ticks()))
    mb = BENCH_RECORDS * RECORD_SIZE / 1e6
    d, p = mb / min(direct), mb / min(proxied)
    report(name, f"direct {d:.0f} MB/s, through tierproxy {p:.0f} MB/s, ratio {p / d:.2f}x (best of {ROUNDS}); "
                 f"all {os.cpu_count()} cores busy {max(busy['direct']):.0%} direct, {max(busy['proxy']):.0%} "
                 "through tierproxy")
    return p / d


def test_kcat_consume_throughput(kafka: KafkaCluster, bench_proxy: ProxyProcess, bench_topic: str, kcat: str) -> None:
    ratio = _compare("kcat consume 1 KiB records",
                     lambda side: _kcat_seconds(kcat, kafka.bootstrap if side == "direct" else bench_proxy.bootstrap,
                                                bench_topic))
    assert ratio > 0.3  # a sanity floor; the figure itself is the result


def test_consumer_perf_test_throughput(kafka: KafkaCluster, bench_proxy: ProxyProcess, bench_topic: str) -> None:
    ratio = _compare("kafka-consumer-perf-test",
                     lambda side: _perf_test_seconds(kafka, kafka.bootstrap if side == "direct"
                                                     else bench_proxy.bootstrap, bench_topic))
    assert ratio > 0.3


def _fetch_latencies(direct: str, proxied: str, topic: str, n: int, offset: int = BENCH_RECORDS - 100,
                     max_bytes: int = 16384) -> tuple[list[float], list[float]]:
    """Alternate one fetch direct, one through the proxy, so both see the same machine noise."""
    body = fetch_request({topic: {0: offset}}, max_bytes=max_bytes)
    out: tuple[list[float], list[float]] = ([], [])
    with WireClient(direct) as d, WireClient(proxied) as p:
        for _ in range(n):
            for client, lat in ((d, out[0]), (p, out[1])):
                start = time.perf_counter()
                client.request_event(1, 12, body)
                lat.append(time.perf_counter() - start)
    return out


def _pct(xs: list[float], q: float) -> float:
    return statistics.quantiles(xs, n=100)[int(q) - 1] * 1e3


def test_added_fetch_latency(kafka: KafkaCluster, bench_proxy: ProxyProcess, bench_topic: str, tmp_path: Path) -> None:
    n = 5000
    broker_port = f"127.0.0.1:{bench_proxy.base + 1}"
    _fetch_latencies(kafka.bootstrap, broker_port, bench_topic, 300)  # warm up both paths
    direct, proxied = _fetch_latencies(kafka.bootstrap, broker_port, bench_topic, n)
    d50, d99, p50, p99 = _pct(direct, 50), _pct(direct, 99), _pct(proxied, 50), _pct(proxied, 99)
    report("fetch latency (16 KiB tail fetch)", f"direct p50 {d50:.3f} ms p99 {d99:.3f} ms; through tierproxy "
           f"p50 {p50:.3f} ms p99 {p99:.3f} ms; added p50 {p50 - d50:.3f} ms p99 {p99 - d99:.3f} ms")
    assert p50 > 0


def test_added_latency_of_a_4_mib_fetch(kafka: KafkaCluster, bench_proxy: ProxyProcess, bench_topic: str) -> None:
    """What a full 4 MiB answer (kcat's fetch.message.max.bytes in the throughput bench) costs through the proxy:
    the time its two copies of the bytes (broker socket → proxy → client socket) take, beside the direct path's
    zero-copy sendfile; the added time over 4 MiB is the proxy's relay rate."""
    broker_port = f"127.0.0.1:{bench_proxy.base + 1}"
    _fetch_latencies(kafka.bootstrap, broker_port, bench_topic, 30, offset=0, max_bytes=4 << 20)
    direct, proxied = _fetch_latencies(kafka.bootstrap, broker_port, bench_topic, 300, offset=0, max_bytes=4 << 20)
    d50, p50 = _pct(direct, 50), _pct(proxied, 50)
    report("fetch latency (4 MiB fetch)", f"direct p50 {d50:.2f} ms, through tierproxy p50 {p50:.2f} ms: added "
           f"{p50 - d50:.2f} ms per 4 MiB = relayed at {4 * 1.048576 / (p50 - d50):.2f} GB/s")
    assert p50 > d50 > 0
