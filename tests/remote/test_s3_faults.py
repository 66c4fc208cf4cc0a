"""Remote reads through S3 faults (a loopback relay in front of moto): 503 SlowDown, a connection reset
mid-body, a body cut short, a flipped byte. Reads retry with backoff within the fetch deadline; what is served
is exactly what the broker served (a corrupt or partial read never reaches the client); metrics count it."""

from __future__ import annotations

import subprocess
import urllib.request
from pathlib import Path

import pytest
from confluent_kafka import Producer

from tests.support.kafka import broker_forgets, create_topic
from tests.support.proxy import ProxyProcess
from tests.support.s3 import S3Server
from tests.support.s3_faults import fault_relay
from tests.support.tiering import settings, tier_once
from tests.support.waiting import wait_until
from tierproxy.dev.kafkadist import KafkaCluster
from tierproxy.dev.ports import free_port

pytestmark = [pytest.mark.kafka, pytest.mark.kcat, pytest.mark.spark, pytest.mark.s3]
RECORDS = 3000


def _read(kcat: str, bootstrap: str, topic: str) -> list[str]:
    out = subprocess.run([kcat, "-b", bootstrap, "-C", "-t", topic, "-o", "beginning", "-e", "-q", "-f", "%o %s\n",
                          "-c", str(RECORDS)], capture_output=True, text=True, timeout=60)
    return out.stdout.splitlines()


def _metric(url: str, name: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return 0.0


def test_reads_through_s3_faults_serve_exactly_the_brokers_bytes(kafka: KafkaCluster, kcat: str, s3: S3Server,
                                                                  tmp_path: Path, topic_name: str) -> None:
    create_topic(kafka.bootstrap, topic_name, config={"segment.ms": "2000"})
    p = Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 5})
    for i in range(RECORDS):
        p.produce(topic_name, f"{i:06d}-".encode() + bytes(range(256)).hex().encode()[: 200])
    p.flush(60)
    expected = _read(kcat, kafka.bootstrap, topic_name)
    assert len(expected) == RECORDS
    s3.create_bucket("faults")
    storage = f"s3://faults/t?endpoint={s3.endpoint}&region={s3.region}"
    s = settings(kafka.bootstrap, tmp_path, topic_name, storage=storage)
    assert tier_once(s).failed == 0
    broker_forgets(kafka.bootstrap, topic_name, above=RECORDS - 1)
    with fault_relay(s3.endpoint) as relay:
        for mode in ("slowdown", "reset", "truncate", "corrupt"):
            relay.mode = mode
            admin = free_port()
            proxy = ProxyProcess(kafka.bootstrap, tmp_path, extra={
                "TIERPROXY_STORAGE": f"s3://faults/t?endpoint={relay.endpoint}&region={s3.region}",
                "TIERPROXY_METADATA": s.metadata or "", "TIERPROXY_ADMIN_LISTEN": f"127.0.0.1:{admin}",
                "TIERPROXY_REMOTE_FETCH_CHUNK_BYTES": str(64 * 1024), "TIERPROXY_REMOTE_FETCH_PREFETCH_CHUNKS": "0",
                "TIERPROXY_REMOTE_LOG_MANAGER_TASK_RETRY_BACKOFF_MS": "50",
                "TIERPROXY_REMOTE_FETCH_MAX_WAIT_MS": "3000"})
            try:
                bootstrap = proxy.bootstrap
                got = wait_until(lambda: (r := _read(kcat, bootstrap, topic_name)) == expected and r,  # noqa: B023
                                 f"kcat reads the whole history through {mode} faults", timeout=120, interval=1)
                assert got == expected
                assert relay.counts.get(mode, 0) > 0, f"no {mode} fault was injected"
                if mode == "corrupt":
                    assert _metric(f"http://127.0.0.1:{admin}", "tierproxy_remote_storage_corrupt_batches_total") > 0
            finally:
                proxy.stop()
