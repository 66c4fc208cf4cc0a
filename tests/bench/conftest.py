"""Benchmarks share one broker with a 1 GiB topic of 1 KiB records, produced once per run."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.kafkahelpers import create_topic
from tierproxy.kafkadist import KafkaCluster

BENCH_RECORDS = int(os.environ.get("TIERPROXY_BENCH_RECORDS", str(1 << 20)))  # 1 GiB of 1 KiB records
RECORD_SIZE = 1024


@pytest.fixture(scope="session")
def bench_topic(kafka: KafkaCluster) -> str:
    topic = "bench-1k"
    create_topic(kafka.bootstrap, topic, config={"segment.bytes": str(256 << 20)})
    cmd = ["java", "-Xmx512m", "-cp", f"{kafka.libs}/*", "org.apache.kafka.tools.ProducerPerformance",
           "--topic", topic, "--num-records", str(BENCH_RECORDS), "--record-size", str(RECORD_SIZE),
           "--throughput", "-1", "--producer-props", f"bootstrap.servers={kafka.bootstrap}", "acks=1",
           "linger.ms=20", "batch.size=262144", "compression.type=none"]
    subprocess.run(cmd, check=True, capture_output=True, timeout=900)
    return topic
