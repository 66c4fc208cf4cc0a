"""RecordBatch v2 views over a record set, without copying or decompressing.

Wire grammar (magic 2):
    RecordBatch => base_offset:int64 batch_length:int32 partition_leader_epoch:int32 magic:int8 crc:uint32
                   attributes:int16 last_offset_delta:int32 base_timestamp:int64 max_timestamp:int64
                   producer_id:int64 producer_epoch:int16 base_sequence:int32 records_count:int32 records
        batch_length counts from partition_leader_epoch to the end; crc (CRC-32C) covers attributes..end.
        attributes: bits 0-2 compression, bit 3 timestamp type (1 = LogAppendTime), bit 4 transactional,
                    bit 5 control, bit 6 delete horizon flag (KIP-534: base_timestamp then holds the horizon of the
                    batch's tombstones and markers, set by the log cleaner; record timestamps stay base + delta).
    Record => length:varint attributes:int8 timestamp_delta:varlong offset_delta:varint key_length:varint key
              value_length:varint value headers_count:varint [key_length:varint key value_length:varint value]
    Control record key => version:int16 type:int16 (0 = ABORT, 1 = COMMIT); value => version:int16
              coordinator_epoch:int32
A fetched record set may end in a partial batch (the broker cuts at max bytes): iteration stops before it.
Older message formats (magic 0/1) share the offset:int64 size:int32 prefix; they are iterated but not parsed.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

import crc32c

from protocol import compression
from protocol.errors import ProtocolError
from protocol.primitives import Reader, Writer, encode_unsigned_varint, zigzag

# base_offset:int64 batch_length:int32 partition_leader_epoch:int32 magic:int8 crc:uint32 attributes:int16
# last_offset_delta:int32 base_timestamp:int64 max_timestamp:int64 producer_id:int64 producer_epoch:int16
# base_sequence:int32 records_count:int32
BATCH_HEADER = struct.Struct(">qiibIhiqqqhii")
# base_offset:int64 batch_length:int32 — the prefix every message format shares
LOG_ENTRY_PREFIX = struct.Struct(">qi")
# version:int16 type:int16
CONTROL_KEY = struct.Struct(">hh")
# version:int16 coordinator_epoch:int32
CONTROL_VALUE = struct.Struct(">hi")
CRC_OFFSET = 17  # where crc:uint32 sits
ATTRIBUTES_OFFSET = 21  # the CRC covers from here to the end
HEADER_SIZE = BATCH_HEADER.size  # 61
LENGTH_OVERHEAD = 12  # base_offset + batch_length precede what batch_length counts

TIMESTAMP_TYPE_BIT = 0x08
TRANSACTIONAL_BIT = 0x10
CONTROL_BIT = 0x20
DELETE_HORIZON_BIT = 0x40
ABORT, COMMIT = 0, 1


class BatchHeader(NamedTuple):
    """The fixed header of a v2 batch, unpacked once."""

    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int


@dataclass(slots=True)
class Header:
    key: str
    value: bytes | None


@dataclass(slots=True)
class Record:
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: list[Header] = field(default_factory=list)


@dataclass(slots=True)
class ControlRecord:
    type: int  # ABORT or COMMIT
    coordinator_epoch: int


class RecordBatch:
    """A view of one batch in a buffer: header fields are read on demand, records only when asked."""

    __slots__ = ("buf", "pos")

    def __init__(self, buf: memoryview, pos: int = 0) -> None:
        self.buf = buf
        self.pos = pos

    def _h(self) -> tuple[int, ...]:
        return BATCH_HEADER.unpack_from(self.buf, self.pos)

    def header(self) -> BatchHeader:
        """Every header field in one unpack (for loops that need several of them)."""
        return BatchHeader._make(BATCH_HEADER.unpack_from(self.buf, self.pos))

    base_offset = property(lambda self: self._h()[0])
    batch_length = property(lambda self: self._h()[1])
    partition_leader_epoch = property(lambda self: self._h()[2])
    magic = property(lambda self: self._h()[3])
    crc = property(lambda self: self._h()[4])
    attributes = property(lambda self: self._h()[5])
    last_offset_delta = property(lambda self: self._h()[6])
    base_timestamp = property(lambda self: self._h()[7])
    max_timestamp = property(lambda self: self._h()[8])
    producer_id = property(lambda self: self._h()[9])
    producer_epoch = property(lambda self: self._h()[10])
    base_sequence = property(lambda self: self._h()[11])
    records_count = property(lambda self: self._h()[12])

    @property
    def size(self) -> int:
        """Bytes the whole batch occupies, prefix included."""
        return int(LOG_ENTRY_PREFIX.unpack_from(self.buf, self.pos)[1]) + LENGTH_OVERHEAD

    @property
    def last_offset(self) -> int:
        return int(self.base_offset + self.last_offset_delta)

    @property
    def compression(self) -> int:
        return int(self.attributes & 0x07)

    @property
    def timestamp_type(self) -> int:
        return 1 if self.attributes & TIMESTAMP_TYPE_BIT else 0

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_BIT)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_BIT)

    def view(self) -> memoryview:
        """The batch's bytes, exactly as stored (no copy)."""
        return self.buf[self.pos:self.pos + self.size]

    def crc_ok(self) -> bool:
        end = self.pos + self.size
        return bool(int(crc32c.crc32c(self.buf[self.pos + ATTRIBUTES_OFFSET:end])) == self.crc)

    def _records_section(self) -> bytes | memoryview:
        data = self.buf[self.pos + HEADER_SIZE:self.pos + self.size]
        codec = self.compression
        return data if codec == compression.NONE else compression.decompress(codec, data)

    def records(self) -> Iterator[Record]:
        """Decode the records (decompressing when needed); malformed data raises `ProtocolError`."""
        if self.magic != 2:
            raise ProtocolError(f"record decoding supports magic 2 only, got {self.magic}")
        section = self._records_section()
        r = Reader(memoryview(section))
        base_offset, base_ts = self.base_offset, self.base_timestamp
        log_append = self.timestamp_type == 1
        for _ in range(self.records_count):
            length = r.varint()
            end = r.pos + length
            if length < 0 or end > r.end:
                raise ProtocolError("record length runs past the batch")
            r.int8()  # attributes (unused)
            ts_delta = r.varlong()
            off_delta = r.varint()
            key = _varbytes(r)
            value = _varbytes(r)
            headers = []
            for _ in range(r.varint()):
                hk = _varbytes(r)
                if hk is None:
                    raise ProtocolError("null header key")
                headers.append(Header(str(hk, "utf-8", "replace"), _varbytes(r)))
            if r.pos != end:
                raise ProtocolError("record length does not match its fields")
            ts = self.max_timestamp if log_append else base_ts + ts_delta
            yield Record(base_offset + off_delta, ts, key, value, headers)

    def control_record(self) -> ControlRecord:
        """The commit/abort marker of a control batch."""
        if not self.is_control:
            raise ProtocolError("not a control batch")
        rec = next(iter(self.records()), None)
        if rec is None or rec.key is None or len(rec.key) < 4 or rec.value is None or len(rec.value) < 6:
            raise ProtocolError("malformed control record")
        _, ctype = CONTROL_KEY.unpack_from(rec.key)
        _, epoch = CONTROL_VALUE.unpack_from(rec.value)
        return ControlRecord(ctype, epoch)


def _varbytes(r: Reader) -> bytes | None:
    n = r.varint()
    if n < 0:
        return None
    return bytes(r.view(n))


def iter_batches(records: memoryview | bytes | None) -> Iterator[RecordBatch]:
    """Whole batches in a record set, in order; a trailing partial batch is skipped (as clients do)."""
    if records is None:
        return
    buf = memoryview(records)
    pos, end = 0, len(buf)
    while end - pos >= LOG_ENTRY_PREFIX.size:
        length = LOG_ENTRY_PREFIX.unpack_from(buf, pos)[1]
        if length < HEADER_SIZE - LENGTH_OVERHEAD and end - pos >= HEADER_SIZE:
            raise ProtocolError(f"batch length {length} at {pos} is smaller than a batch header")
        size = length + LENGTH_OVERHEAD
        if pos + size > end or end - pos < HEADER_SIZE:
            return
        yield RecordBatch(buf, pos)
        pos += size


def whole_batches_size(records: memoryview | bytes) -> int:
    """Bytes taken by the whole batches at the start of a record set."""
    total = 0
    for b in iter_batches(records):
        total = b.pos + b.size
    return total


def build_batch(records: list[Record], *, base_offset: int = 0, codec: int = compression.NONE,
                partition_leader_epoch: int = 0, producer_id: int = -1, producer_epoch: int = -1,
                base_sequence: int = -1, transactional: bool = False, control: bool = False,
                log_append_time: bool = False) -> bytes:
    """Encode a v2 batch (CRC-32C back-patched with pack_into). For tests and tools."""
    if not records:
        raise ValueError("a batch needs at least one record")
    base_ts = min(r.timestamp for r in records)
    max_ts = max(r.timestamp for r in records)
    body = Writer()
    for rec in records:
        w = Writer()
        w.int8(0)
        w.varlong(rec.timestamp - base_ts)
        w.varint(rec.offset - base_offset)
        _write_varbytes(w, rec.key)
        _write_varbytes(w, rec.value)
        w.varint(len(rec.headers))
        for h in rec.headers:
            _write_varbytes(w, h.key.encode())
            _write_varbytes(w, h.value)
        body.varint(len(w.buf))
        body.raw(w.buf)
    section = bytes(body.buf)
    if codec != compression.NONE:
        section = compression.compress(codec, section)
    attributes = codec | (TIMESTAMP_TYPE_BIT if log_append_time else 0) | \
        (TRANSACTIONAL_BIT if transactional else 0) | (CONTROL_BIT if control else 0)
    last_delta = max(r.offset for r in records) - base_offset
    out = bytearray(HEADER_SIZE + len(section))
    BATCH_HEADER.pack_into(out, 0, base_offset, len(out) - LENGTH_OVERHEAD, partition_leader_epoch, 2, 0,
                           attributes, last_delta, base_ts, max_ts, producer_id, producer_epoch, base_sequence,
                           len(records))
    out[HEADER_SIZE:] = section
    struct.pack_into(">I", out, CRC_OFFSET, crc32c.crc32c(memoryview(out)[ATTRIBUTES_OFFSET:]))
    return bytes(out)


def build_empty_batch(base_offset: int, last_offset: int, *, partition_leader_epoch: int = -1,
                      producer_id: int = -1, producer_epoch: int = -1, base_sequence: int = -1,
                      max_timestamp: int = -1, attributes: int = 0) -> bytes:
    """A v2 batch with no records spanning [base_offset, last_offset], as the log cleaner leaves one when it
    removes every record of a batch: a client moves its position past it to last_offset + 1 (KAFKA-5443; the
    Java consumer and librdkafka take the next offset from the batch header, not from its records).

    As Kafka's `DefaultRecordBatch.writeEmptyHeader`: no compression, base timestamp -1, no delete horizon; of
    `attributes` only the timestamp type, transactional and control bits are kept."""
    if last_offset < base_offset:
        raise ValueError(f"an empty batch spans at least one offset: [{base_offset}, {last_offset}]")
    out = bytearray(HEADER_SIZE)
    attributes &= TIMESTAMP_TYPE_BIT | TRANSACTIONAL_BIT | CONTROL_BIT
    BATCH_HEADER.pack_into(out, 0, base_offset, HEADER_SIZE - LENGTH_OVERHEAD, partition_leader_epoch, 2, 0,
                           attributes, last_offset - base_offset, -1, max_timestamp, producer_id, producer_epoch,
                           base_sequence, 0)
    struct.pack_into(">I", out, CRC_OFFSET, crc32c.crc32c(memoryview(out)[ATTRIBUTES_OFFSET:]))
    return bytes(out)


def build_control_batch(marker: int, *, offset: int, producer_id: int, producer_epoch: int, timestamp: int,
                        coordinator_epoch: int = 0, partition_leader_epoch: int = 0) -> bytes:
    """A transaction marker batch (COMMIT or ABORT)."""
    rec = Record(offset, timestamp, CONTROL_KEY.pack(0, marker), CONTROL_VALUE.pack(0, coordinator_epoch))
    return build_batch([rec], base_offset=offset, producer_id=producer_id, producer_epoch=producer_epoch,
                       transactional=True, control=True, partition_leader_epoch=partition_leader_epoch)


def _write_varbytes(w: Writer, v: bytes | None) -> None:
    if v is None:
        w.varint(-1)
    else:
        w.varint(len(v))
        w.raw(v)


# A record's place in a batch's (decompressed) records section, read without building a Record:
# (offset_delta, timestamp_delta, key_start, key_length (-1: null), has_value, tail_start, end) — the tail
# (key_length..headers) is copied as is when the batch is rebuilt.
RecordSpan = tuple[int, int, int, int, bool, int, int]


def _uvarint(buf: bytes, pos: int) -> tuple[int, int]:
    b = buf[pos]
    if b < 0x80:
        return b, pos + 1
    result, shift = b & 0x7F, 7
    while True:
        pos += 1
        b = buf[pos]
        if shift == 63 and b & 0x7F > 1:
            raise ProtocolError("varint past 64 bits")
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos + 1
        shift += 7
        if shift > 63:
            raise ProtocolError("varint longer than 10 bytes")


def scan_records(batch: RecordBatch) -> tuple[bytes, list[RecordSpan]]:
    """The batch's records section (decompressed) and each record's span in it, for filtering and rebuilding."""
    h = batch.header()
    section = bytes(batch._records_section())
    spans: list[RecordSpan] = []
    append = spans.append
    pos, size = 0, len(section)
    try:
        for _ in range(h.records_count):
            # varints inlined for their one-byte form (the usual one for small deltas and keys): a call less each
            v = section[pos]
            if v < 0x80:
                pos += 1
            else:
                v, pos = _uvarint(section, pos)
            length = (v >> 1) ^ -(v & 1)
            end = pos + length
            if length < 0 or end > size:
                raise ProtocolError("record length runs past the batch")
            p = pos + 1  # attributes
            v = section[p]
            if v < 0x80:
                p += 1
            else:
                v, p = _uvarint(section, p)
            ts_delta = (v >> 1) ^ -(v & 1)
            v = section[p]
            if v < 0x80:
                p += 1
            else:
                v, p = _uvarint(section, p)
            off_delta = (v >> 1) ^ -(v & 1)
            if not -2**31 <= off_delta < 2**31:  # Kafka's offsetDelta is an int (its offset base + delta)
                raise ProtocolError(f"batch at {h.base_offset}: an offset delta past a 32-bit int")
            tail = p
            v = section[p]
            if v < 0x80:
                p += 1
            else:
                v, p = _uvarint(section, p)
            key_len = (v >> 1) ^ -(v & 1)
            key_start = p
            if key_len >= 0:
                p += key_len
            if p >= end:  # the value's length and the headers' count are the record's too: a byte each at least
                raise ProtocolError(f"batch at {h.base_offset}: a key runs past its record")
            # the value's length: -1 (zigzag 1) is the one-byte 0x01
            append((off_delta, ts_delta, key_start, key_len, section[p] != 1, tail, end))
            pos = end
    except IndexError as exc:
        raise ProtocolError(f"batch at {h.base_offset}: truncated record") from exc
    return section, spans


def rebuild_batch(h: BatchHeader, section: bytes, spans: list[RecordSpan], *, delete_horizon_ms: int) -> bytes:
    """A batch of `spans` (some of the records of the batch `h`; at least one) as Kafka's log cleaner writes a
    batch it partly keeps (`MemoryRecords.buildRetainedRecordsInto`): the same base offset, last offset delta,
    producer id/epoch, base sequence, leader epoch, codec and flags; the base timestamp is the delete horizon when
    `delete_horizon_ms` ≥ 0 (the delete horizon bit then set), else the first kept record's timestamp; record
    timestamps are unchanged; a new CRC."""
    body, base_ts, max_ts = rebuilt_body(h, section, spans, delete_horizon_ms)
    return finish_rebuilt(h, body, len(spans), base_ts, max_ts, delete_horizon_ms)


def rebuilt_body(h: BatchHeader, section: bytes, spans: list[RecordSpan],
                 delete_horizon_ms: int) -> tuple[bytes, int, int]:
    """The uncompressed records section of `rebuild_batch`, its base and its max timestamp (the record heads
    re-encoded against the new base, the tails copied); the compaction's compiled kernel writes the same."""
    log_append = bool(h.attributes & TIMESTAMP_TYPE_BIT)
    # a record's timestamp is base + delta whether or not the base holds a delete horizon; sums as Java longs (they
    # wrap past 2**63, as Kafka's do and the compaction's compiled kernel's)
    stamps = [h.max_timestamp if log_append else _long(h.base_timestamp + s[1]) for s in spans]
    base_ts = delete_horizon_ms if delete_horizon_ms >= 0 else stamps[0]
    max_ts = h.max_timestamp if log_append else max(stamps)
    body = bytearray()
    for span, ts in zip(spans, stamps, strict=True):
        head = b"\x00" + encode_unsigned_varint(zigzag(_long(ts - base_ts)) & 0xFFFFFFFFFFFFFFFF) + \
            encode_unsigned_varint(zigzag(span[0]) & 0xFFFFFFFF)
        rest = section[span[5]:span[6]]
        body += encode_unsigned_varint(zigzag(len(head) + len(rest)) & 0xFFFFFFFF)
        body += head
        body += rest
    return bytes(body), base_ts, max_ts


def _long(v: int) -> int:
    """`v` as a Java long holds it (wrapped to 64 bits)."""
    return (v + 2**63) % 2**64 - 2**63


def finish_rebuilt(h: BatchHeader, body: bytes | memoryview, count: int, base_ts: int, max_ts: int,
                   delete_horizon_ms: int) -> bytes:
    """`rebuild_batch`'s batch around an uncompressed records section of `count` records: compressed with the
    batch's codec, its header, a new CRC."""
    codec = h.attributes & 0x07
    records = body if codec == compression.NONE else compression.compress(codec, bytes(body))
    attributes = (h.attributes & ~DELETE_HORIZON_BIT) | (DELETE_HORIZON_BIT if delete_horizon_ms >= 0 else 0)
    out = bytearray(HEADER_SIZE + len(records))
    BATCH_HEADER.pack_into(out, 0, h.base_offset, len(out) - LENGTH_OVERHEAD, h.partition_leader_epoch, 2, 0,
                           attributes, h.last_offset_delta, base_ts, max_ts, h.producer_id, h.producer_epoch,
                           h.base_sequence, count)
    out[HEADER_SIZE:] = records
    struct.pack_into(">I", out, CRC_OFFSET, crc32c.crc32c(memoryview(out)[ATTRIBUTES_OFFSET:]))
    return bytes(out)
