"""RecordBatch v2 views: built batches, every codec, control records, and batches written by real producers."""

from __future__ import annotations

import struct
import subprocess
import time

import pytest
from confluent_kafka import Producer

from protocol import compression
from protocol.constants import ApiKey
from protocol.errors import ProtocolError
from protocol.records import (
    ABORT,
    COMMIT,
    CRC_OFFSET,
    Record,
    build_batch,
    build_control_batch,
    build_empty_batch,
    iter_batches,
    whole_batches_size,
)
from protocol.requests import fetch_request
from tests.support.jvm import java_command
from tests.support.kafka import create_topic
from tests.support.samples import records_of
from tierproxy.dev.kafkadist import KafkaCluster
from tierproxy.kafka.wireclient import WireClient

CODECS = [compression.NONE, compression.GZIP, compression.SNAPPY, compression.LZ4, compression.ZSTD]




@pytest.mark.parametrize("codec", CODECS, ids=[compression.NAMES[c] for c in CODECS])
def test_build_and_read_every_codec(codec: int) -> None:
    recs = records_of(20, base=100)
    raw = build_batch(recs, base_offset=100, codec=codec, partition_leader_epoch=7, producer_id=42,
                      producer_epoch=3, base_sequence=5, transactional=True)
    (batch,) = list(iter_batches(raw))
    assert batch.crc_ok() and batch.magic == 2 and batch.compression == codec
    assert (batch.base_offset, batch.last_offset, batch.records_count) == (100, 119, 20)
    assert (batch.partition_leader_epoch, batch.producer_id, batch.producer_epoch, batch.base_sequence) == (7, 42, 3, 5)
    assert batch.is_transactional and not batch.is_control
    assert batch.max_timestamp == recs[-1].timestamp and batch.base_timestamp == recs[0].timestamp
    assert list(batch.records()) == recs
    assert bytes(batch.view()) == raw


def test_crc_detects_corruption_and_partial_trailing_batch_is_skipped() -> None:
    a = build_batch(records_of(3))
    b = bytearray(build_batch(records_of(3, base=3), base_offset=3))
    b[-1] ^= 0xFF
    batches = list(iter_batches(a + bytes(b) + a[:30]))
    assert [x.base_offset for x in batches] == [0, 3]
    assert batches[0].crc_ok() and not batches[1].crc_ok()
    assert whole_batches_size(a + a[:-1]) == len(a)


def test_control_records() -> None:
    for marker in (ABORT, COMMIT):
        raw = build_control_batch(marker, offset=9, producer_id=5, producer_epoch=1, timestamp=1, coordinator_epoch=4)
        (batch,) = list(iter_batches(raw))
        assert batch.is_control and batch.is_transactional
        ctl = batch.control_record()
        assert (ctl.type, ctl.coordinator_epoch) == (marker, 4)
    with pytest.raises(ProtocolError):
        next(iter(iter_batches(build_batch(records_of(1))))).control_record()


def test_corrupt_compressed_data_raises_protocol_error() -> None:
    raw = bytearray(build_batch(records_of(5), codec=compression.ZSTD))
    raw[70:80] = b"\x00" * 10
    struct.pack_into(">I", raw, CRC_OFFSET, 0)
    with pytest.raises(ProtocolError):
        list(next(iter(iter_batches(bytes(raw)))).records())


def _fetch_all(bootstrap: str, topic: str, expected: int) -> list[Record]:
    got: list[Record] = []
    with WireClient(bootstrap) as client:
        deadline = time.monotonic() + 30
        while len(got) < expected and time.monotonic() < deadline:
            resp = client.request(ApiKey.FETCH, 12, fetch_request({topic: {0: len(got)}}, max_bytes=1 << 24,
                                                                  max_wait_ms=200, min_bytes=1))
            part = resp["responses"][0]["partitions"][0]
            assert part["error_code"] == 0
            for batch in iter_batches(part["records"]):
                assert batch.crc_ok()
                got += [r for r in batch.records() if r.offset >= len(got)]
    return got


@pytest.mark.kafka
@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_decode_batches_written_by_librdkafka(kafka: KafkaCluster, topic_name: str, codec: str) -> None:
    create_topic(kafka.bootstrap, topic_name)
    p = Producer({"bootstrap.servers": kafka.bootstrap, "compression.type": codec, "linger.ms": 50})
    sent = [(None if i % 7 == 0 else f"key{i}".encode(), f"val{i}".encode() * 20, [("h", b"v")]) for i in range(300)]
    for key, value, headers in sent:
        p.produce(topic_name, value, key, headers=headers)
    p.flush(30)
    got = _fetch_all(kafka.bootstrap, topic_name, len(sent))
    assert [(r.key, r.value, [(h.key, h.value) for h in r.headers]) for r in got] == sent


@pytest.mark.kafka
@pytest.mark.parametrize("codec", ["snappy", "lz4", "zstd", "gzip"])
def test_decode_batches_written_by_the_java_producer(kafka: KafkaCluster, topic_name: str, codec: str) -> None:
    create_topic(kafka.bootstrap, topic_name)
    cmd = [*java_command(), "-Xmx256m", "-cp", f"{kafka.libs}/*", "org.apache.kafka.tools.ProducerPerformance",
           "--topic", topic_name, "--num-records", "500", "--record-size", "200", "--throughput", "-1",
           "--producer-props", f"bootstrap.servers={kafka.bootstrap}", f"compression.type={codec}", "linger.ms=20"]
    subprocess.run(cmd, check=True, capture_output=True, timeout=120)
    got = _fetch_all(kafka.bootstrap, topic_name, 500)
    assert len(got) == 500 and [r.offset for r in got] == list(range(500))
    assert all(r.value is not None and len(r.value) == 200 for r in got)


def test_an_empty_batch_spans_its_offsets_with_no_records_and_a_valid_crc() -> None:
    raw = build_empty_batch(1000, 1004)
    (b,) = list(iter_batches(raw))
    assert (b.base_offset, b.last_offset, b.size, b.crc_ok()) == (1000, 1004, 61, True)
    assert list(b.records()) == [] and not b.is_control
    with pytest.raises(ValueError):
        build_empty_batch(5, 4)
