"""3-broker cluster: the partition leader dies mid-consume; the consumer through the proxy moves to the new
leader's proxy port and reads everything exactly once."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient

from tests.support.kafka import create_topic
from tests.support.proxy import ProxyProcess
from tierproxy.dev.kafkadist import KafkaCluster

pytestmark = [pytest.mark.kafka, pytest.mark.cluster]


def _leader(bootstrap: str, topic: str) -> int:
    md = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10)
    return int(md.topics[topic].partitions[0].leader)


def test_leader_dies_mid_consume_no_loss_no_duplicates(kafka_cluster: KafkaCluster, tmp_path: Path,
                                                       topic_name: str) -> None:
    create_topic(kafka_cluster.bootstrap, topic_name, partitions=1, replication=3, config={"min.insync.replicas": "2"})
    proxy = ProxyProcess(kafka_cluster.bootstrap, tmp_path)
    try:
        p = Producer({"bootstrap.servers": proxy.bootstrap, "acks": "all", "linger.ms": 5})
        total = 3000
        for i in range(total):
            p.produce(topic_name, f"r{i}".encode())
        assert p.flush(60) == 0
        c = Consumer({"bootstrap.servers": proxy.bootstrap, "group.id": "leader-change",
                      "auto.offset.reset": "earliest", "max.partition.fetch.bytes": 4096,
                      "topic.metadata.refresh.interval.ms": 1000})
        c.subscribe([topic_name])
        got: list[tuple[int, str]] = []
        leader = _leader(kafka_cluster.bootstrap, topic_name)
        killed = False
        deadline = time.monotonic() + 120
        while len(got) < total and time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is not None and m.error() is None:
                got.append((m.offset(), m.value().decode()))
            if not killed and len(got) >= total // 3:
                kafka_cluster.stop_node(leader, kill=True)
                killed = True
        c.close()
        assert killed
        survivors = [n for n in kafka_cluster.nodes if n.alive]
        new_leader = _leader(survivors[0].bootstrap, topic_name)
        assert new_leader != leader
        assert [o for o, _ in got] == list(range(total))  # every offset once, in order
        assert [v for _, v in got] == [f"r{i}" for i in range(total)]
        assert f"proxy port {proxy.base + new_leader}" in proxy.log_text()
    finally:
        proxy.stop()
