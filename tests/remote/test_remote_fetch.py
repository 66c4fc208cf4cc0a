"""Consumers read a topic from offset 0 through the proxy after the broker deleted its early segments."""

from __future__ import annotations

import asyncio
import hashlib
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer

from protocol.constants import ApiKey
from protocol.records import iter_batches
from protocol.requests import fetch_request, list_offsets_request
from tests.remote.conftest import TieredTopic, make_tiered_topic
from tests.support.certs import make_certs
from tests.support.proxy import ProxyProcess
from tests.support.waiting import proxy_serves_tier, wait_until
from tierproxy.dev.kafkadist import KafkaCluster
from tierproxy.dev.ports import free_port
from tierproxy.kafka.wireclient import WireClient

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


def test_kcat_reads_everything_from_offset_zero(tiered_proxy: tuple[TieredTopic, ProxyProcess], kcat: str) -> None:
    tt, proxy = tiered_proxy
    for partition in range(tt.partitions):
        out = subprocess.run([kcat, "-b", proxy.bootstrap, "-C", "-t", tt.topic, "-p", str(partition), "-o",
                              "beginning", "-e", "-q", "-f", "%o %k %s\\n", "-Z"], capture_output=True,
                             timeout=120)
        assert out.returncode == 0, out.stderr.decode()[-2000:]
        lines = out.stdout.decode().splitlines()
        offsets = [int(line.split(" ", 1)[0]) for line in lines]
        assert offsets == list(range(len(tt.produced[partition])))
        got = [(line.split(" ")[1], line.split(" ", 2)[2]) for line in lines]
        want = [("NULL" if k is None else k.decode(), v.decode() if v else "") for k, v, _ in tt.produced[partition]]
        assert got == want


def test_sendfile_answers_are_the_read_answers(kafka: KafkaCluster, tiered_proxy: tuple[TieredTopic, ProxyProcess],
                                               kcat: str, tmp_path: Path) -> None:
    """The same tier through a plaintext listener (records sent from the segment files with sendfile) and a TLS
    listener (records read, CRC-checked and encrypted): kcat gets the same records, offsets and timestamps from both,
    and the metric says which path each took."""
    tt, _ = tiered_proxy
    certs = make_certs(tmp_path / "certs")
    env = {"TIERPROXY_STORAGE": f"file://{tt.tmp}/tier", "TIERPROXY_METADATA": f"file://{tt.tmp}/meta"}
    plain = ProxyProcess(kafka.bootstrap, tmp_path, extra={**env, "TIERPROXY_ADMIN_LISTEN": f"127.0.0.1:{free_port()}"})
    tls = ProxyProcess(kafka.bootstrap, tmp_path, extra={**env, "TIERPROXY_ADMIN_LISTEN": f"127.0.0.1:{free_port()}",
                                                       "TIERPROXY_SSL_CERTFILE": str(certs.cert),
                                                       "TIERPROXY_SSL_KEYFILE": str(certs.key)})
    try:
        wait_until(lambda: proxy_serves_tier(plain.bootstrap, tt.topic, tt.partitions), "the tier is served", 60)
        outs = []
        for proxy, opts in ((plain, []), (tls, ["-X", "security.protocol=ssl", "-X", f"ssl.ca.location={certs.ca}"])):
            out = subprocess.run([kcat, "-b", proxy.bootstrap, *opts, "-C", "-t", tt.topic, "-p", "0", "-o",
                                  "beginning", "-e", "-q", "-f", "%o %T %k %s\\n", "-X", "check.crcs=true"],
                                 capture_output=True, timeout=120)
            assert out.returncode == 0, out.stderr.decode()[-2000:]
            outs.append(out.stdout)
        assert outs[0] == outs[1] and len(outs[0].splitlines()) == len(tt.produced[0])
        assert plain.metric("tierproxy_remote_fetch_sendfile_bytes_total") > 0
        assert tls.metric("tierproxy_remote_fetch_sendfile_bytes_total") == 0
        assert tls.metric("tierproxy_remote_cache_misses_total") > 0  # the TLS proxy read its answers from the tier
    finally:
        plain.stop()
        tls.stop()


def _consume_confluent(bootstrap: str, topic: str, want: int, extra: dict[str, object] | None = None,
                       timeout: float = 90) -> list[tuple[int, int, bytes | None, bytes | None]]:
    from confluent_kafka import Consumer

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4().hex[:6]}",
                  "auto.offset.reset": "earliest", "enable.auto.commit": True, **(extra or {})})
    c.subscribe([topic])
    got = []
    deadline = time.monotonic() + timeout
    while len(got) < want and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and m.error() is None:
            got.append((m.partition(), m.offset(), m.key(), m.value()))
    c.close()
    return got


def test_confluent_group_and_aiokafka_read_identical_records(tiered_proxy: tuple[TieredTopic, ProxyProcess]) -> None:
    tt, proxy = tiered_proxy
    total = sum(len(v) for v in tt.produced.values())
    got = _consume_confluent(proxy.bootstrap, tt.topic, total)
    for partition in range(tt.partitions):
        mine = sorted((o, k, v) for p, o, k, v in got if p == partition)
        assert [o for o, _, _ in mine] == list(range(len(tt.produced[partition])))
        assert hashlib.sha256(b"".join(repr((k, v)).encode() for _, k, v in mine)).hexdigest() == tt.digest(partition)

    async def aio() -> dict[int, list[tuple[bytes | None, bytes | None]]]:
        cons = AIOKafkaConsumer(tt.topic, bootstrap_servers=proxy.bootstrap, auto_offset_reset="earliest",
                                group_id=f"aio-{uuid.uuid4().hex[:6]}")
        await cons.start()
        out: dict[int, list[tuple[bytes | None, bytes | None]]] = {p: [] for p in range(tt.partitions)}
        try:
            async with asyncio.timeout(90):
                while sum(len(v) for v in out.values()) < total:
                    for tp, msgs in (await cons.getmany(timeout_ms=500)).items():
                        out[tp.partition] += [(m.key, m.value) for m in msgs]
        finally:
            await cons.stop()
        return out

    by_partition = asyncio.run(aio())
    for partition in range(tt.partitions):
        assert by_partition[partition] == [(k, v) for k, v, _ in tt.produced[partition]]


def test_list_offsets_earliest_local_and_latest_tiered(tiered_proxy: tuple[TieredTopic, ProxyProcess],
                                                       kafka: KafkaCluster) -> None:
    tt, proxy = tiered_proxy

    def ask(bootstrap: str, ts: int, partition: int = 0) -> dict[str, int]:
        with WireClient(bootstrap) as w:
            resp = w.request(ApiKey.LIST_OFFSETS, 9, list_offsets_request({tt.topic: {partition: ts}}))
        return resp["topics"][0]["partitions"][0]

    broker_port = f"127.0.0.1:{proxy.base + 1}"
    for partition in range(tt.partitions):
        assert ask(kafka.bootstrap, -2, partition)["offset"] >= tt.log_starts[partition] > 0  # the broker alone
        assert ask(broker_port, -2, partition)["offset"] == 0  # through the proxy: the tier's start
        local = ask(broker_port, -4, partition)
        assert local["error_code"] == 0 and local["offset"] == ask(kafka.bootstrap, -4, partition)["offset"] > 0
        tiered_end = ask(broker_port, -5, partition)
        assert tiered_end["error_code"] == 0 and 0 < tiered_end["offset"] < len(tt.produced[partition])
        assert ask(broker_port, -1, partition)["offset"] == len(tt.produced[partition])


def test_seek_by_timestamp_into_the_tier(tiered_proxy: tuple[TieredTopic, ProxyProcess]) -> None:
    from confluent_kafka import Consumer, TopicPartition

    tt, proxy = tiered_proxy
    k, v, ts = tt.produced[0][40]
    c = Consumer({"bootstrap.servers": proxy.bootstrap, "group.id": f"ts-{uuid.uuid4().hex[:6]}"})
    (tp,) = c.offsets_for_times([TopicPartition(tt.topic, 0, ts)], timeout=30)
    assert tp.offset == 40
    c.assign([TopicPartition(tt.topic, 0, tp.offset)])
    m = None
    deadline = time.monotonic() + 30
    while m is None and time.monotonic() < deadline:
        m = c.poll(0.5)
    c.close()
    assert m is not None and m.error() is None and (m.offset(), m.key(), m.value()) == (40, k, v)


def test_fetch_of_ten_partitions_some_remote_some_local(kafka: KafkaCluster, tmp_path: Path, topic_name: str) -> None:
    tt = make_tiered_topic(kafka, tmp_path, topic_name, partitions=10, n=4000)
    # what is tested is one answer mixing tier and broker partitions; a tier read still running when the purgatory
    # expires is answered empty, as Kafka's DelayedRemoteFetch does (a loaded CI machine once took > 500 ms for the
    # first reads of five partitions): the purgatory waits long enough for the reads to finish here
    proxy = ProxyProcess(kafka.bootstrap, tmp_path, extra={"TIERPROXY_STORAGE": f"file://{tmp_path}/tier",
                                                           "TIERPROXY_METADATA": f"file://{tmp_path}/meta",
                                                           "TIERPROXY_REMOTE_FETCH_MAX_WAIT_MS": "30000"})
    try:
        wait_until(lambda: proxy_serves_tier(f"127.0.0.1:{proxy.base + 1}", topic_name, 10), "the tier via the proxy")
        wanted = {p: (0 if p % 2 == 0 else tt.log_starts[p]) for p in range(10)}  # even: remote, odd: local
        body = fetch_request({topic_name: wanted}, max_bytes=50 << 20, partition_max_bytes=1 << 20, max_wait_ms=100,
                             min_bytes=1)
        with WireClient(f"127.0.0.1:{proxy.base + 1}") as w:
            resp = w.request(ApiKey.FETCH, 12, body)
        parts = resp["responses"][0]["partitions"]
        assert [p["partition_index"] for p in parts] == list(range(10))  # exactly the requested, in order
        for p in parts:
            assert p["error_code"] == 0, p
            batches = list(iter_batches(p["records"]))
            assert batches and batches[0].base_offset <= wanted[p["partition_index"]] <= batches[0].last_offset
            assert p["high_watermark"] == len(tt.produced[p["partition_index"]])
            records = [r for b in batches for r in b.records() if r.offset >= wanted[p["partition_index"]]]
            want = tt.produced[p["partition_index"]][wanted[p["partition_index"]]:][:len(records)]
            assert [(r.key, r.value) for r in records] == [(k, v) for k, v, _ in want]
    finally:
        proxy.stop()
