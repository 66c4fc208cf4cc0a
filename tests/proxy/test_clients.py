"""Every kind of client works through tierproxy against the real broker, exactly as against the broker."""

from __future__ import annotations

import asyncio
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.support.jvm import java_command
from tests.support.kafka import create_topic, read_to_end
from tests.support.proxy import ProxyProcess
from tierproxy.dev.kafkadist import KafkaCluster

pytestmark = pytest.mark.kafka


def test_kcat_metadata_shows_only_proxy_addresses(proxy: ProxyProcess, kafka: KafkaCluster, kcat: str,
                                                   topic_name: str) -> None:
    create_topic(kafka.bootstrap, topic_name, partitions=3)
    out = subprocess.run([kcat, "-b", proxy.bootstrap, "-L", "-t", topic_name], capture_output=True, text=True,
                         check=True, timeout=30).stdout
    assert f"broker 1 at 127.0.0.1:{proxy.base + 1}" in out
    assert str(kafka.nodes[0].port) not in out
    assert "3 partitions" in out


def test_kcat_produce_and_consume(proxy: ProxyProcess, kcat: str, topic_name: str, kafka: KafkaCluster) -> None:
    create_topic(kafka.bootstrap, topic_name, partitions=2)
    lines = [f"{i}:value-{i}" for i in range(500)]
    subprocess.run([kcat, "-b", proxy.bootstrap, "-P", "-t", topic_name, "-K", ":", "-z", "snappy"],
                   input="\n".join(lines) + "\n", text=True, check=True, timeout=60)
    out = subprocess.run([kcat, "-b", proxy.bootstrap, "-C", "-t", topic_name, "-o", "beginning", "-e", "-q",
                          "-f", "%k:%s\n"], capture_output=True, text=True, check=True, timeout=60).stdout
    assert sorted(out.splitlines()) == sorted(lines)


def test_kcat_through_a_proxy_on_the_asyncio_loop(kafka: KafkaCluster, kcat: str, topic_name: str,
                                                  tmp_path: Path) -> None:
    """event.loop=asyncio (an option; uvloop, the default where installed, serves every other test): the same
    relay on the standard loop."""
    proxy = ProxyProcess(kafka.bootstrap, tmp_path, extra={"TIERPROXY_EVENT_LOOP": "asyncio"})
    try:
        create_topic(kafka.bootstrap, topic_name, partitions=2)
        lines = [f"{i}:value-{i}" for i in range(500)]
        subprocess.run([kcat, "-b", proxy.bootstrap, "-P", "-t", topic_name, "-K", ":"],
                       input="\n".join(lines) + "\n", text=True, check=True, timeout=60)
        out = subprocess.run([kcat, "-b", proxy.bootstrap, "-C", "-t", topic_name, "-o", "beginning", "-e", "-q",
                              "-f", "%k:%s\n"], capture_output=True, text=True, check=True, timeout=60).stdout
        assert sorted(out.splitlines()) == sorted(lines)
        assert "event loop asyncio" in proxy.log_text()
    finally:
        proxy.stop()


def _drain(c: Consumer, want: int, seen: list[tuple[int, int]], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while len(seen) < want and time.monotonic() < deadline:
        m = c.poll(0.2)
        if m is not None and m.error() is None:
            seen.append((m.partition(), m.offset()))


def test_confluent_group_of_two_with_commits_and_rebalance(proxy: ProxyProcess, kafka: KafkaCluster,
                                                           topic_name: str) -> None:
    create_topic(kafka.bootstrap, topic_name, partitions=4)
    p = Producer({"bootstrap.servers": proxy.bootstrap})
    for i in range(400):
        p.produce(topic_name, f"m{i}".encode(), partition=i % 4)
    p.flush(30)
    group = f"g-{uuid.uuid4().hex[:8]}"
    conf = {"bootstrap.servers": proxy.bootstrap, "group.id": group, "auto.offset.reset": "earliest",
            "enable.auto.commit": False, "session.timeout.ms": 6000, "heartbeat.interval.ms": 500}
    a = Consumer(conf)
    a.subscribe([topic_name])
    seen_a: list[tuple[int, int]] = []
    _drain(a, 200, seen_a)
    a.commit(asynchronous=False)
    b = Consumer(conf)
    b.subscribe([topic_name])
    seen_b: list[tuple[int, int]] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (len(set(seen_a) | set(seen_b)) < 400 or not b.assignment()):
        for c, seen in ((a, seen_a), (b, seen_b)):
            m = c.poll(0.1)
            if m is not None and m.error() is None:
                seen.append((m.partition(), m.offset()))
                c.commit(m, asynchronous=False)
    assert a.assignment() and b.assignment(), "the second member got no partitions: no rebalance"
    assert {tp.partition for tp in a.assignment()}.isdisjoint({tp.partition for tp in b.assignment()})
    assert len(set(seen_a) | set(seen_b)) == 400
    committed = a.committed([TopicPartition(topic_name, i) for i in range(4)], timeout=10)
    assert sum(tp.offset for tp in committed) == 400
    a.close()
    b.close()


def test_aiokafka_producer_and_consumer(proxy: ProxyProcess, kafka: KafkaCluster, topic_name: str) -> None:
    create_topic(kafka.bootstrap, topic_name, partitions=3)

    async def run() -> list[bytes]:
        prod = AIOKafkaProducer(bootstrap_servers=proxy.bootstrap, compression_type="gzip")
        await prod.start()
        for i in range(300):
            await prod.send(topic_name, f"aio-{i}".encode())
        await prod.flush()
        await prod.stop()
        cons = AIOKafkaConsumer(topic_name, bootstrap_servers=proxy.bootstrap, auto_offset_reset="earliest",
                                group_id=f"aio-{uuid.uuid4().hex[:6]}")
        await cons.start()
        got: list[bytes] = []
        try:
            async with asyncio.timeout(30):
                while len(got) < 300:
                    for msgs in (await cons.getmany(timeout_ms=500)).values():
                        got += [m.value for m in msgs if m.value is not None]
            await cons.commit()
        finally:
            await cons.stop()
        return got

    assert sorted(asyncio.run(run())) == sorted(f"aio-{i}".encode() for i in range(300))


def test_transactions_read_committed(proxy: ProxyProcess, kafka: KafkaCluster, topic_name: str) -> None:
    create_topic(kafka.bootstrap, topic_name)
    p = Producer({"bootstrap.servers": proxy.bootstrap, "transactional.id": f"tx-{topic_name}"})
    p.init_transactions(30)
    for outcome in ("commit", "abort", "commit"):
        p.begin_transaction()
        for i in range(10):
            p.produce(topic_name, f"{outcome}-{i}".encode())
        p.flush(30)  # aborted records must reach the log (librdkafka purges unsent ones on abort)
        if outcome == "commit":
            p.commit_transaction(30)
        else:
            p.abort_transaction(30)
    seen: list[str] = []
    for isolation in ("read_committed", "read_uncommitted"):
        got = read_to_end(proxy.bootstrap, topic_name, isolation, timeout=30)
        seen.append(",".join(got))
        if isolation == "read_committed":
            assert len(got) == 20 and all(v.startswith("commit") for v in got)
        else:
            assert len(got) == 30
    assert seen[0] != seen[1]


def test_admin_client_creates_topics_through_the_proxy(proxy: ProxyProcess, kafka: KafkaCluster,
                                                       topic_name: str) -> None:
    admin = AdminClient({"bootstrap.servers": proxy.bootstrap})
    admin.create_topics([NewTopic(topic_name, 5, 1, config={"retention.ms": "3600000"})])[topic_name].result(30)
    direct = AdminClient({"bootstrap.servers": kafka.bootstrap})
    md = direct.list_topics(topic_name, timeout=10).topics[topic_name]
    assert len(md.partitions) == 5
    cluster = admin.describe_cluster().result(10)
    assert all(n.port != kafka.nodes[0].port for n in cluster.nodes)


def test_java_console_consumer_through_the_proxy(proxy: ProxyProcess, kafka: KafkaCluster, topic_name: str) -> None:
    create_topic(kafka.bootstrap, topic_name, partitions=2)
    p = Producer({"bootstrap.servers": kafka.bootstrap})
    for i in range(200):
        p.produce(topic_name, f"java-{i}".encode(), partition=i % 2)
    p.flush(30)
    cmd = [*java_command(), "-Xmx256m", "-cp", f"{kafka.libs}/*", "org.apache.kafka.tools.consumer.ConsoleConsumer",
           "--bootstrap-server", proxy.bootstrap, "--topic", topic_name, "--from-beginning",
           "--max-messages", "200", "--timeout-ms", "30000", "--group", f"java-{uuid.uuid4().hex[:6]}"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
    assert out.returncode == 0, out.stderr[-2000:]
    assert sorted(out.stdout.split()) == sorted(f"java-{i}" for i in range(200))


def test_kafka_python_consumer_through_the_proxy(proxy: ProxyProcess, kafka: KafkaCluster, topic_name: str) -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from kafka import KafkaConsumer, KafkaProducer
    create_topic(kafka.bootstrap, topic_name)
    prod = KafkaProducer(bootstrap_servers=proxy.bootstrap)
    for i in range(50):
        prod.send(topic_name, f"kp-{i}".encode())
    prod.flush(30)
    prod.close()
    cons = KafkaConsumer(topic_name, bootstrap_servers=proxy.bootstrap, auto_offset_reset="earliest",
                         consumer_timeout_ms=5000)
    got = [m.value for m in cons]
    cons.close()
    assert got == [f"kp-{i}".encode() for i in range(50)]


def test_acks0_produce_gets_no_response_and_later_requests_still_match(proxy: ProxyProcess, kafka: KafkaCluster,
                                                                       topic_name: str) -> None:
    create_topic(kafka.bootstrap, topic_name)

    async def run() -> list[bytes]:
        prod = AIOKafkaProducer(bootstrap_servers=proxy.bootstrap, acks=0)
        await prod.start()
        for i in range(100):
            await prod.send(topic_name, f"a0-{i}".encode())
        await prod.flush()
        md = await prod.client.fetch_all_metadata()  # a request with a response after the acks=0 ones
        assert topic_name in md.topics()
        await prod.stop()
        cons = AIOKafkaConsumer(topic_name, bootstrap_servers=proxy.bootstrap, auto_offset_reset="earliest")
        await cons.start()
        got: list[bytes] = []
        try:
            async with asyncio.timeout(30):
                while len(got) < 100:
                    for msgs in (await cons.getmany(timeout_ms=500)).values():
                        got += [m.value for m in msgs if m.value is not None]
        finally:
            await cons.stop()
        return got

    assert asyncio.run(run()) == [f"a0-{i}".encode() for i in range(100)]
