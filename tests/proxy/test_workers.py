"""`serve --workers N`: workers share the ports and divide the bounds, one /metrics sums them, a worker killed -9 is
restarted and its clients read on."""

from __future__ import annotations

import os
import re
import signal
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer

from protocol.constants import ApiKey
from tests.support.kafka import create_topic
from tests.support.proxy import ProxyProcess
from tests.support.waiting import wait_until
from tierproxy.config import ProxySettings
from tierproxy.dev.kafkadist import KafkaCluster
from tierproxy.dev.ports import free_port
from tierproxy.kafka.wireclient import WireClient

pytestmark = pytest.mark.kafka
QUEUED = 64 << 20  # queued.max.request.bytes for the whole pool


def _metrics(proxy: ProxyProcess) -> str:
    assert proxy.admin_url is not None
    with urllib.request.urlopen(proxy.admin_url + "/metrics", timeout=10) as r:
        return str(r.read().decode())


def _per_worker(text: str, name: str) -> dict[str, tuple[int, float]]:
    """{worker: (pid, value)} of a per-worker series."""
    found = re.findall(name + r'\{pid="(\d+)",worker="(\d+)"\} (\S+)', text)
    return {worker: (int(pid), float(value)) for pid, worker, value in found}


def _pool(kafka: KafkaCluster, tmp: Path) -> ProxyProcess:
    proxy = ProxyProcess(kafka.bootstrap, tmp, args=["--workers", "2"], extra={
        "TIERPROXY_ADMIN_LISTEN": f"127.0.0.1:{free_port()}", "TIERPROXY_QUEUED_MAX_REQUEST_BYTES": str(QUEUED)})
    wait_until(lambda: len(_per_worker(_metrics(proxy), "tierproxy_worker_up")) == 2, "both workers in /metrics",
               timeout=60)
    return proxy


@pytest.fixture(scope="module")
def pool(kafka: KafkaCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProcess]:
    proxy = _pool(kafka, tmp_path_factory.mktemp("workers"))
    yield proxy
    proxy.stop()


def test_a_worker_gets_its_share_of_each_bound() -> None:
    s = ProxySettings(bootstrap_servers="127.0.0.1:9092", queued_max_request_bytes=QUEUED, max_connections=101,
                      remote_fetch_cache_bytes=0, admin_listen="127.0.0.1:8080")
    one, two = s.for_worker(0, 2), s.for_worker(1, 2)
    assert (one.queued_max_request_bytes, one.max_connections, one.admin_listen) == (QUEUED // 2, 50, s.admin_listen)
    assert (two.remote_fetch_cache_bytes, two.remote_log_manager_fetch_max_bytes_per_second) == (0, -1)
    assert two.admin_listen is None, "the admin API runs in the first worker only"
    assert s.for_worker(0, 1) is s
    auto = ProxySettings(bootstrap_servers="127.0.0.1:9092", workers="auto")
    assert auto.worker_count == len(os.sched_getaffinity(0)), "auto: the cores this process may run on"


def test_two_workers_answer_on_the_same_ports_and_metrics_sum_both(pool: ProxyProcess, kafka: KafkaCluster) -> None:
    clients = [WireClient(pool.bootstrap) for _ in range(16)]
    try:
        for c in clients:  # each connection is a session in the worker the kernel gave it to
            assert c.request(ApiKey.API_VERSIONS, 3, {"client_software_name": "t",
                                                      "client_software_version": "1"})["error_code"] == 0
        wait_until(lambda: pool.metric("tierproxy_client_connections") == 16, "16 connections in /metrics")
        text = _metrics(pool)
        per = _per_worker(text, "tierproxy_worker_client_connections")
        assert set(per) == {"0", "1"} and all(v >= 1 for _, v in per.values()), per  # 2**-15 that one gets all
        assert len({pid for pid, _ in per.values()} | {pool.proc.pid}) == 3, "two worker processes and the supervisor"
        # each worker holds half the bound: the pool's metric (summed) is the configured total
        assert pool.metric("tierproxy_queued_max_request_bytes") == QUEUED
    finally:
        for c in clients:
            c.close()
    log = pool.log_text()
    for worker in ("0/2", "1/2"):  # every worker listens on the bootstrap port (SO_REUSEPORT)
        assert f"[worker {worker}] tierproxy.proxy.server: tierproxy listening on 127.0.0.1:{pool.port}" in log, log


def test_a_worker_killed_is_restarted_and_its_clients_read_on(kafka: KafkaCluster, tmp_path: Path,
                                                              topic_name: str) -> None:
    n = 3000
    create_topic(kafka.bootstrap, topic_name, partitions=1)
    producer = Producer({"bootstrap.servers": kafka.bootstrap})
    for i in range(n):
        producer.produce(topic_name, value=b"v%d" % i)
    producer.flush(30)
    proxy = _pool(kafka, tmp_path)
    try:
        _read_through_kills(proxy, topic_name, n)
        pids = [pid for pid, _ in _per_worker(_metrics(proxy), "tierproxy_worker_up").values()]
    finally:
        rc = proxy.stop()
    assert rc == 0, proxy.log_text()[-3000:]
    for pid in pids:  # SIGTERM to the supervisor stopped every worker
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def _read_through_kills(proxy: ProxyProcess, topic_name: str, n: int) -> None:
    """A consumer through the pool reads `n` records while each worker in turn is killed -9 and restarted."""
    # small fetches and almost no read-ahead: the consumer is still fetching when each worker is killed
    consumer = Consumer({"bootstrap.servers": proxy.bootstrap, "group.id": topic_name, "enable.auto.commit": False,
                         "auto.offset.reset": "earliest", "message.max.bytes": 4096, "fetch.max.bytes": 4096,
                         "max.partition.fetch.bytes": 4096, "queued.min.messages": 1,
                         "queued.max.messages.kbytes": 4, "reconnect.backoff.ms": 50,
                         "reconnect.backoff.max.ms": 500})
    consumer.subscribe([topic_name])
    offsets: list[int] = []

    def read(upto: int) -> None:
        deadline = time.monotonic() + 60
        while len(offsets) < upto:
            assert time.monotonic() < deadline, f"read {len(offsets)} of {upto} records in 60 s"
            m = consumer.poll(1.0)
            if m is not None and m.error() is None:
                offsets.append(m.offset())

    try:
        read(n // 3)
        for worker, upto in (("1", 2 * n // 3), ("0", n)):  # each in turn: the consumer's connections are on one
            old = _per_worker(_metrics(proxy), "tierproxy_worker_up")[worker][0]
            os.kill(old, signal.SIGKILL)
            wait_until(lambda w=worker, o=old: f"worker {w} (pid {o}) was killed by SIGKILL" in proxy.log_text(),
                       f"the supervisor saying worker {worker} was killed")
            new = wait_until(lambda w=worker: _per_worker(_metrics(proxy), "tierproxy_worker_up").get(w, (0, 0))[0],
                             f"worker {worker} restarted", timeout=60)
            assert new != old
            read(upto)
    finally:
        consumer.close()
    assert offsets == list(range(n)), "every record once, in order, across both kills"
    text = _metrics(proxy)
    assert 'tierproxy_worker_restarts_total{worker="0"} 1.0' in text
    assert 'tierproxy_worker_restarts_total{worker="1"} 1.0' in text
