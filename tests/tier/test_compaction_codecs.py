"""A batch the tier's cleaning keeps in part, in each codec Kafka writes (gzip, snappy, lz4, zstd) and with both
timestamp types: rebuilt as Kafka's cleaner rebuilds it — the same codec, base offset, last offset delta, base
sequence and producer, each kept record's timestamp and headers — and read back by Kafka's own DumpLogSegments
--deep-iteration with valid CRCs."""

from __future__ import annotations

import struct
from pathlib import Path

import crc32c
import pytest

from protocol import compression
from protocol.records import (
    ATTRIBUTES_OFFSET,
    CRC_OFFSET,
    DELETE_HORIZON_BIT,
    Header,
    Record,
    RecordBatch,
    build_batch,
    iter_batches,
)
from tests.support.compaction import Tier
from tests.tier.test_compaction_parity import dump_log_segments
from tierproxy.dev.kafkadist import KafkaCluster
from tierproxy.tier.compaction import CleanerConfig

pytestmark = pytest.mark.kafka
CODECS = {compression.GZIP: "gzip", compression.SNAPPY: "snappy", compression.LZ4: "lz4", compression.ZSTD: "zstd"}
APPEND_TIME = 5_000  # the broker's LogAppendTime: later than the records' own timestamps
NOW, RETENTION = 10_000, 1_000
MAX_TS_OFFSET = 35  # base_offset:8 length:4 epoch:4 magic:1 crc:4 attributes:2 last_offset_delta:4 base_ts:8


def _log_append_time(raw: bytes) -> bytes:
    """The batch as a broker with message.timestamp.type=LogAppendTime stores it: max timestamp set, CRC anew."""
    out = bytearray(raw)
    struct.pack_into(">q", out, MAX_TS_OFFSET, APPEND_TIME)
    struct.pack_into(">I", out, CRC_OFFSET, crc32c.crc32c(memoryview(out)[ATTRIBUTES_OFFSET:]))
    return bytes(out)


def test_partly_kept_compressed_batches_are_valid_kafka_batches(kafka: KafkaCluster, tmp_path: Path) -> None:
    tier = Tier(CleanerConfig(min_cleanable_dirty_ratio=0.0, delete_retention_ms=RETENTION))
    offset, expected, whole = 0, [], {}
    for codec in CODECS:
        for append_time in (False, True):
            recs = [Record(offset, 1_000 + offset, b"a%d" % offset, b"x" * 50),
                    Record(offset + 1, 1_003 + offset, b"gone%d" % offset, b"y"),
                    Record(offset + 2, 999 + offset, b"c%d" % offset, None if append_time else b"z" * 30,
                           [Header("h", b"v")])]  # a tombstone: the batch gets a delete horizon (KIP-534)
            raw = build_batch(recs, base_offset=offset, codec=codec, producer_id=7, producer_epoch=1,
                              base_sequence=offset, log_append_time=append_time)
            newer = build_batch([Record(offset + 3, 1_100, b"gone%d" % offset, b"newer")], base_offset=offset + 3,
                                codec=codec)
            tier.append([_log_append_time(raw) if append_time else raw, newer])
            whole[offset + 3] = newer
            stamps = [APPEND_TIME] * 2 if append_time else [recs[0].timestamp, recs[2].timestamp]
            expected.append((offset, codec, append_time, [recs[0], recs[2]], stamps))
            offset += 4
    cleaned = tier.clean(NOW)
    assert cleaned
    batches = {b.base_offset: b for b in iter_batches(tier.log())}
    for base, codec, append_time, recs, stamps in expected:
        b = batches[base]
        assert isinstance(b, RecordBatch) and b.crc_ok()
        assert (b.compression, b.timestamp_type, b.last_offset, b.base_sequence, b.producer_id) == \
            (codec, int(append_time), base + 2, base, 7)
        got = list(b.records())
        assert [(r.offset, r.key, r.value, r.headers) for r in got] == \
            [(r.offset, r.key, r.value, r.headers) for r in recs]
        assert [r.timestamp for r in got] == stamps  # base timestamp + delta, also under a delete horizon
        assert b.max_timestamp == max(stamps)
        assert (b.base_timestamp if b.attributes & DELETE_HORIZON_BIT else None) == \
            (NOW + RETENTION if append_time else None)

    for base, raw in whole.items():  # a batch kept whole is its exact bytes
        assert bytes(batches[base].view()) == raw

    out = dump_log_segments(kafka, cleaned, tmp_path)
    lines = [line for line in out.splitlines() if "isvalid:" in line]
    assert len(lines) == len(batches) and all("isvalid: true" in line for line in lines), out[-3000:]
    # --deep-iteration decompressed every batch: a line per record
    assert out.count("| offset: ") == sum(b.records_count for b in batches.values()), out[-3000:]
    for base, codec, append_time, _, _ in expected:
        line = next(line for line in lines if line.startswith(f"baseOffset: {base} "))
        assert f"compresscodec: {CODECS[codec]}" in line, line
        assert ("LogAppendTime" in line) == append_time, line
        assert (f"deleteHorizonMs: OptionalLong[{NOW + RETENTION}]" in line) == append_time, line
