"""The tail through tierproxy beside a bare relay, same broker, same data, same run.

The broker has a second listener (RELAY, plaintext) advertised at a bare relay's port (`tests/bench/bare_relay.py`,
cut-through, no parsing) that forwards to it: a client bootstrapping at the relay keeps every connection on the
relay, as a client of tierproxy keeps every connection on tierproxy. The same reads run direct, through the relay
and through tierproxy, alternated, medians of `ROUNDS`: proxy/direct, relay/direct and proxy/relay with kcat and
with kafka-consumer-perf-test, core-seconds per GB of each (and the broker's), and the latency of a 16 KiB tail
fetch (p50/p99) on each path.

    pytest -m bench tests/bench/test_relay_side_by_side.py -s   (TIERPROXY_BENCH_RELAY_RECORDS, default 512Ki x 1 KiB)
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from protocol.requests import fetch_request
from tests.bench.clients import kcat_seconds, perf_test_seconds, produce
from tests.bench.report import cpu_seconds, report
from tests.support.kafka import create_topic
from tests.support.parts import stop_process
from tests.support.proxy import ProxyProcess
from tierproxy.dev.kafkadist import KafkaCluster
from tierproxy.dev.ports import free_port
from tierproxy.kafka.wireclient import WireClient

pytestmark = [pytest.mark.bench, pytest.mark.kafka]
RECORDS = int(os.environ.get("TIERPROXY_BENCH_RELAY_RECORDS", str(512 << 10)))
ROUNDS = int(os.environ.get("TIERPROXY_BENCH_RELAY_ROUNDS", "3"))
TOPIC = "side-by-side"
SMALL = "side-by-side-16k"  # 16 KiB batches: a 16 KiB fetch answers 16 KiB (TOPIC's 256 KiB batches answer 256 KiB)
PATHS = ("direct", "relay", "proxy")


class Paths:
    def __init__(self, kafka: KafkaCluster, relay_port: int, relay: subprocess.Popen[bytes],
                 proxy: ProxyProcess) -> None:
        self.kafka, self.relay_port, self.relay, self.proxy = kafka, relay_port, relay, proxy

    def bootstrap(self, path: str) -> str:
        return {"direct": self.kafka.bootstrap, "relay": f"127.0.0.1:{self.relay_port}",
                "proxy": self.proxy.bootstrap}[path]

    def broker_address(self, path: str) -> str:
        """Where a fetch to the partition leader goes on each path (tierproxy's per-broker port)."""
        return {"direct": self.kafka.bootstrap, "relay": f"127.0.0.1:{self.relay_port}",
                "proxy": f"127.0.0.1:{self.proxy.base + 1}"}[path]

    def pid(self, path: str) -> int:
        return {"relay": self.relay.pid, "proxy": self.proxy.proc.pid}[path]


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Paths]:
    work = tmp_path_factory.mktemp("side-by-side")
    relay_port = free_port()
    kafka = KafkaCluster(1, work / "kafka", extra_listeners={"RELAY": "PLAINTEXT"})
    node = kafka.nodes[0]
    node.extra["advertised.listeners"] = f"PLAINTEXT://127.0.0.1:{node.port},RELAY://127.0.0.1:{relay_port}"
    kafka.start()
    relay = subprocess.Popen([sys.executable, "-m", "tests.bench.bare_relay", str(relay_port),
                              str(node.listener_ports["RELAY"]), "uvloop"], stdout=subprocess.PIPE)
    assert relay.stdout is not None and b"relaying" in relay.stdout.readline()
    proxy = ProxyProcess(kafka.bootstrap, work)
    try:
        create_topic(kafka.bootstrap, TOPIC, config={"segment.bytes": str(256 << 20)})
        produce(kafka, TOPIC, RECORDS)
        create_topic(kafka.bootstrap, SMALL)
        produce(kafka, SMALL, 20_000, batch_bytes=16384)
        yield Paths(kafka, relay_port, relay, proxy)
    finally:
        proxy.stop()
        stop_process(relay, 10)
        if relay.stdout is not None:
            relay.stdout.close()
        kafka.stop()


def _side_by_side(name: str, p: Paths, run: Callable[[str], float]) -> dict[str, float]:
    """MB/s per path (median of ROUNDS, paths alternated each round), and the core-seconds per GB each relaying
    process and the broker spent in those runs."""
    broker = p.kafka.nodes[0].proc
    assert broker is not None
    times: dict[str, list[float]] = {k: [] for k in PATHS}
    cpu: dict[str, float] = {"relay": 0.0, "proxy": 0.0, "broker direct": 0.0}
    for path in PATHS:
        run(path)  # warm-up: page cache, JIT, connections
    for _ in range(ROUNDS):
        for path in PATHS:
            before = {k: cpu_seconds(p.pid(k)) for k in ("relay", "proxy")}
            b0 = cpu_seconds(broker.pid)
            times[path].append(run(path))
            if path != "direct":
                cpu[path] += cpu_seconds(p.pid(path)) - before[path]
            else:
                cpu["broker direct"] += cpu_seconds(broker.pid) - b0
    mb = RECORDS * 1024 / 1e6
    rate = {k: mb / statistics.median(v) for k, v in times.items()}
    gb = RECORDS * 1024 / 1e9 * ROUNDS
    report(name, f"direct {rate['direct']:.0f} MB/s, bare relay {rate['relay']:.0f} MB/s, tierproxy "
                 f"{rate['proxy']:.0f} MB/s: proxy/direct {rate['proxy'] / rate['direct']:.2f}, relay/direct "
                 f"{rate['relay'] / rate['direct']:.2f}, proxy/relay {rate['proxy'] / rate['relay']:.2f} (median of "
                 f"{ROUNDS}); core-s/GB relay {cpu['relay'] / gb:.2f}, proxy {cpu['proxy'] / gb:.2f} "
                 f"(x{cpu['proxy'] / max(cpu['relay'], 1e-9):.2f}), broker serving direct "
                 f"{cpu['broker direct'] / gb:.2f}")
    return rate


def test_kcat_tail_side_by_side(paths: Paths, kcat: str) -> None:
    rate = _side_by_side("tail vs bare relay (kcat)", paths,
                         lambda path: kcat_seconds(kcat, paths.bootstrap(path), TOPIC, RECORDS))
    assert rate["proxy"] > 0 and rate["relay"] > 0


def test_consumer_perf_test_tail_side_by_side(paths: Paths) -> None:
    rate = _side_by_side("tail vs bare relay (kafka-consumer-perf-test)", paths,
                         lambda path: perf_test_seconds(paths.kafka, paths.bootstrap(path), TOPIC,
                                                           RECORDS))
    assert rate["proxy"] > 0 and rate["relay"] > 0


def _pct(xs: list[float], q: int) -> float:
    return statistics.quantiles(xs, n=100)[q - 1] * 1e3


@pytest.mark.parametrize("topic, size", [(SMALL, "16 KiB"), (TOPIC, "256 KiB")])
def test_tail_fetch_latency_side_by_side(paths: Paths, topic: str, size: str) -> None:
    """One fetch of max_bytes 16 KiB at a time; it answers one whole batch: 16 KiB from SMALL, 256 KiB from TOPIC
    (the broker returns at least one batch), so the second shows what storing a response whole costs."""
    body = fetch_request({topic: {0: (20_000 if topic == SMALL else RECORDS) - 100}}, max_bytes=16384)
    lat: dict[str, list[float]] = {k: [] for k in PATHS}
    clients: dict[str, Any] = {k: WireClient(paths.broker_address(k)) for k in PATHS}
    answered = 0
    try:
        for n in range(5300):  # alternate the paths; the first 300 rounds warm up
            for path in PATHS:
                start = time.perf_counter()
                ev = clients[path].request_event(1, 12, body)
                if n >= 300:
                    lat[path].append(time.perf_counter() - start)
                answered = len(ev.frame)
    finally:
        for c in clients.values():
            c.close()
    p50 = {k: _pct(v, 50) for k, v in lat.items()}
    p99 = {k: _pct(v, 99) for k, v in lat.items()}
    report(f"{size} tail fetch latency vs bare relay",
           f"responses of {answered} bytes; " +
           "; ".join(f"{k} p50 {p50[k]:.3f} ms p99 {p99[k]:.3f} ms" for k in PATHS) +
           f"; added by tierproxy p50 {p50['proxy'] - p50['direct']:.3f} ms p99 {p99['proxy'] - p99['direct']:.3f} "
           f"ms, by the relay p50 {p50['relay'] - p50['direct']:.3f} ms p99 {p99['relay'] - p99['direct']:.3f} ms; "
           f"proxy p50 - relay p50 {p50['proxy'] - p50['relay']:.3f} ms")
    assert p50["proxy"] > 0
    assert (answered < 20_000) == (topic == SMALL)
