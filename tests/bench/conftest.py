"""Benchmarks share one broker with a 1 GiB topic of 1 KiB records, produced once per run."""

from __future__ import annotations

import os

import pytest

from tests.bench.clients import produce
from tests.support.kafka import create_topic
from tests.support.spark import SESSION_JARS, spark_avro_jars
from tierproxy.dev.kafkadist import KafkaCluster

BENCH_RECORDS = int(os.environ.get("TIERPROXY_BENCH_RECORDS", str(1 << 20)))  # 1 GiB of 1 KiB records
RECORD_SIZE = 1024


@pytest.fixture(scope="session")
def bench_topic(kafka: KafkaCluster) -> str:
    topic = "bench-1k"
    create_topic(kafka.bootstrap, topic, config={"segment.bytes": str(256 << 20)})
    produce(kafka, topic, BENCH_RECORDS, RECORD_SIZE)
    return topic


@pytest.fixture(scope="session", autouse=True)
def _spark_avro_on_the_session() -> None:
    """The benchmarks share the process's Spark session (`tests.support.spark.worker_session`); the typed Iceberg
    one needs Spark's Avro functions (`from_avro`) on its class path, which is fixed when the session's JVM starts,
    so they are asked for before any benchmark starts it (resolved only then)."""
    if spark_avro_jars not in SESSION_JARS:
        SESSION_JARS.append(spark_avro_jars)
