"""The floor: a real Kafka 4.x broker, kcat and S3 (SeaweedFS) work in every test run."""

from __future__ import annotations

import asyncio
import subprocess
import time

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from confluent_kafka import Producer

from tests.support.kafka import create_topic, watermarks
from tests.support.s3 import S3Server
from tierproxy.dev.kafkadist import KAFKA_VERSION, KafkaCluster

pytestmark = pytest.mark.kafka


def test_broker_is_the_pinned_kafka(kafka: KafkaCluster) -> None:
    assert KAFKA_VERSION.startswith("4.")
    assert (kafka.libs / f"kafka_2.13-{KAFKA_VERSION}.jar").exists()
    assert all(n.alive for n in kafka.nodes)


def test_the_runs_brokers_compile_with_c1_alone_and_benchmarks_keep_the_full_jit(kafka: KafkaCluster,
                                                                                   pytestconfig: pytest.Config) -> None:
    """tests/support/jvm.py: the suite's JVMs with C1 alone (a CPU-bound suite on 2 cores), never a benchmark's."""
    import os

    from tests.conftest import _selects_benchmarks

    def selects(expression: str) -> bool:
        pytestconfig.option.markexpr = expression
        return _selects_benchmarks(pytestconfig)

    given = pytestconfig.option.markexpr
    try:
        assert [selects(e) for e in ("not bench", "not (kafka or spark or process or bench)", "bench", "kafka",
                                     "bench and kafka")] == [False, False, True, True, True]
    finally:
        pytestconfig.option.markexpr = given
    assert not _selects_benchmarks(pytestconfig)  # this run: no benchmarks, so its brokers run C1 alone
    assert "-XX:TieredStopAtLevel=1" in os.environ["SPARK_SUBMIT_OPTS"].split()  # and its Spark drivers
    props = (kafka.nodes[0].workdir / "server.properties").read_text().splitlines()
    assert "metadata.max.idle.interval.ms=5000" in props  # fewer idle wake-ups (tests/support/jvm.py)
    for node in kafka.nodes:
        assert node.proc is not None
        with open(f"/proc/{node.proc.pid}/cmdline", "rb") as f:
            assert b"-XX:TieredStopAtLevel=1" in f.read().split(b"\0")


def test_aiokafka_produce_consume(kafka: KafkaCluster, topic_name: str) -> None:
    create_topic(kafka.bootstrap, topic_name, partitions=2)
    sent = {f"k{i}".encode(): f"v{i}".encode() * (i + 1) for i in range(50)}

    async def run() -> dict[bytes, bytes]:
        producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap)
        await producer.start()
        try:
            for k, v in sent.items():
                await producer.send(topic_name, v, key=k)
            await producer.flush()
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(topic_name, bootstrap_servers=kafka.bootstrap,
                                    auto_offset_reset="earliest", enable_auto_commit=False)
        await consumer.start()
        got: dict[bytes, bytes] = {}
        try:
            async with asyncio.timeout(30):
                while len(got) < len(sent):
                    batch = await consumer.getmany(timeout_ms=500)
                    for msgs in batch.values():
                        for m in msgs:
                            assert m.key is not None and m.value is not None
                            got[m.key] = m.value
        finally:
            await consumer.stop()
        return got

    assert asyncio.run(run()) == sent


def test_kcat_produce_consume(kafka: KafkaCluster, kcat: str, topic_name: str) -> None:
    create_topic(kafka.bootstrap, topic_name)
    lines = [f"line-{i}" for i in range(100)]
    subprocess.run([kcat, "-b", kafka.bootstrap, "-P", "-t", topic_name], input="\n".join(lines) + "\n",
                   text=True, check=True, timeout=60)
    out = subprocess.run([kcat, "-b", kafka.bootstrap, "-C", "-t", topic_name, "-o", "beginning", "-e", "-q"],
                         capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.splitlines() == lines


def test_broker_deletes_old_segments_within_60s(kafka: KafkaCluster, topic_name: str) -> None:
    # segment.ms rolls a segment per burst; retention.ms expires all but the active one
    create_topic(kafka.bootstrap, topic_name, config={"segment.ms": "100", "retention.ms": "1000",
                                                      "file.delete.delay.ms": "0"})
    p = Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 0})
    ts0 = int(time.time() * 1000) - 60_000  # each burst stamped a second later: its first record rolls the segment
    for burst in range(6):
        for i in range(20):
            p.produce(topic_name, f"b{burst}-{i}".encode(), timestamp=ts0 + burst * 1000)
        p.flush(10)
    deadline = time.monotonic() + 60
    start, end = watermarks(kafka.bootstrap, topic_name)
    while start == 0 and time.monotonic() < deadline:
        time.sleep(0.5)
        p.produce(topic_name, b"tick")  # appends roll the expired active segment
        p.flush(10)
        start, end = watermarks(kafka.bootstrap, topic_name)
    assert 0 < start <= end
    assert end >= 120


def test_s3_server_round_trip(s3: S3Server) -> None:
    from aiobotocore.session import get_session

    async def run() -> bytes:
        session = get_session()
        async with session.create_client("s3", endpoint_url=s3.endpoint, region_name=s3.region,
                                         aws_access_key_id=s3.access_key,
                                         aws_secret_access_key=s3.secret_key) as client:
            await client.create_bucket(Bucket="tier")
            await client.put_object(Bucket="tier", Key="a/b.log", Body=b"0123456789")
            resp = await client.get_object(Bucket="tier", Key="a/b.log", Range="bytes=2-5")
            async with resp["Body"] as body:
                data: bytes = await body.read()
            return data

    assert asyncio.run(run()) == b"2345"


def test_three_node_cluster_elects_leaders(kafka_cluster: KafkaCluster, topic_name: str) -> None:
    create_topic(kafka_cluster.bootstrap, topic_name, partitions=3, replication=3)
    assert sum(n.alive for n in kafka_cluster.nodes) == 3
    leaderless = kafka_cluster.nodes[0]
    kafka_cluster.stop_node(leaderless.node_id)
    start, end = watermarks(kafka_cluster.nodes[1].bootstrap, topic_name)
    assert (start, end) == (0, 0)
