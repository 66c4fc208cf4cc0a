"""Golden vectors: frames captured from real kcat, confluent-kafka and aiokafka sessions against the real
Kafka 4.x broker (through a recording relay) decode and re-encode to the identical bytes, and agree with
kafka-python's independent codec."""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from confluent_kafka import Consumer, Producer

from protocol import registry
from protocol.apis.produce import produce_acks
from protocol.headers import decode_request_header, decode_response_header, response_header_version
from protocol.primitives import Writer
from tests.support.crosscheck import common_fields_differ, theirs_decode
from tests.support.kafka import create_topic
from tests.support.parts import unavailable
from tests.support.relay import RecordingRelay
from tierproxy.dev.kafkadist import KafkaCluster, KafkaUnavailable

pytestmark = pytest.mark.kafka


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RecordingRelay]:
    """A broker that advertises the relay's port, so every client connection goes through the relay."""
    try:
        cluster = KafkaCluster(1, workdir=tmp_path_factory.mktemp("golden"))
    except KafkaUnavailable as exc:
        unavailable("Apache Kafka", str(exc))
    node = cluster.nodes[0]
    relay = RecordingRelay(("127.0.0.1", node.port))
    node.extra["advertised.listeners"] = f"PLAINTEXT://127.0.0.1:{relay.port}"
    try:
        cluster.start()
    except KafkaUnavailable as exc:
        relay.close()
        unavailable("Apache Kafka", str(exc))
    bootstrap = f"127.0.0.1:{relay.port}"
    try:
        _run_clients(bootstrap, cluster.libs, Path(cluster.workdir))
        yield relay
    finally:
        relay.close()
        cluster.stop()


def _run_clients(bootstrap: str, libs: Path, workdir: Path) -> None:
    create_topic(bootstrap, "golden", partitions=2)
    kcat = subprocess.run(["which", "kcat"], capture_output=True, text=True).stdout.strip()
    if not kcat:
        unavailable("kcat", "not on PATH")
    subprocess.run([kcat, "-b", bootstrap, "-P", "-t", "golden", "-z", "lz4"], input="a\nb\nc\n", text=True,
                   check=True, timeout=60)
    subprocess.run([kcat, "-b", bootstrap, "-C", "-t", "golden", "-o", "beginning", "-e", "-q"], check=True,
                   capture_output=True, timeout=60)
    p = Producer({"bootstrap.servers": bootstrap, "compression.type": "zstd", "linger.ms": 5})
    for i in range(50):
        p.produce("golden", f"ck-{i}".encode(), f"k{i}".encode())
    p.flush(30)
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "golden-group", "auto.offset.reset": "earliest"})
    c.subscribe(["golden"])
    got, deadline = 0, time.monotonic() + 30
    while got < 53 and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and m.error() is None:
            got += 1
    c.commit(asynchronous=False)
    c.close()

    async def aio() -> None:
        prod = AIOKafkaProducer(bootstrap_servers=bootstrap, acks=0)
        await prod.start()
        await prod.send_and_wait("golden", b"aio-acks0")
        await prod.stop()
        prod = AIOKafkaProducer(bootstrap_servers=bootstrap)
        await prod.start()
        await prod.send_and_wait("golden", b"aio")
        await prod.stop()
        cons = AIOKafkaConsumer("golden", bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                                group_id="golden-aio")
        await cons.start()
        await cons.getmany(timeout_ms=2000)
        await cons.stop()

    asyncio.run(aio())


def _pairs(relay: RecordingRelay) -> Iterator[tuple[bytes, bytes | None]]:
    for cap in relay.captures:
        responses = iter(cap.responses)
        for req in cap.requests:
            header = decode_request_header(memoryview(req))
            if header.api_key == 0 and produce_acks(memoryview(req), header.api_version, header.body_offset) == 0:
                yield req, None
                continue
            yield req, next(responses, None)


def test_capture_covers_the_interesting_apis(recorded: RecordingRelay) -> None:
    seen = {decode_request_header(memoryview(req)).api_key for req, _ in _pairs(recorded)}
    assert {0, 1, 2, 3, 10, 18} <= seen


def test_captured_frames_reencode_byte_identical(recorded: RecordingRelay) -> None:
    checked = 0
    for req, resp in _pairs(recorded):
        header = decode_request_header(memoryview(req))
        if not registry.supports(header.api_key, header.api_version):
            continue
        api = registry.SUPPORTED[header.api_key]
        if api.request is not None:
            body = registry.decode_request(header, memoryview(req))
            w = Writer()
            w.raw(header.encode())
            api.request.encode_into(w, body, header.api_version)
            assert b"".join(bytes(c) for c in w.finish()) == req, f"request {api.name} v{header.api_version}"
            theirs = theirs_decode(header.api_key, "request", header.api_version, req[header.body_offset:])
            if theirs is not None:
                assert common_fields_differ(body, theirs) == []
            checked += 1
        if resp is None:
            continue
        hv = response_header_version(header.api_key, header.api_version)
        cid, offset = decode_response_header(memoryview(resp), hv)
        assert cid == header.correlation_id
        data = registry.decode_response(header.api_key, header.api_version, memoryview(resp), offset)
        again = registry.encode_response(header.api_key, header.api_version, cid, data)
        assert b"".join(bytes(c) for c in again)[4:] == resp, f"response {api.name} v{header.api_version}"
        theirs = theirs_decode(header.api_key, "response", header.api_version, resp[offset:])
        if theirs is not None:
            assert common_fields_differ(data, theirs) == []
        checked += 1
    assert checked > 50
