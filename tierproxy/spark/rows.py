"""Record batches → rows in the schema of Spark's Kafka source, as Arrow record batches (no per-row Python objects
cross into Spark).

Batches are the exact bytes the broker served (from the tier or a live fetch). Control batches never become rows;
with read_committed, a transactional batch of a producer whose transaction is known aborted is dropped — the Java
consumer's rule (`CompletedFetch`): before each batch, every aborted transaction whose first offset is at or below
the batch's last offset marks its producer as aborted; that producer's ABORT marker clears it.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator
from typing import Any

from protocol import compression
from protocol.errors import ProtocolError
from protocol.records import ABORT, HEADER_SIZE, RecordBatch

SCHEMA_DDL = ("key binary, value binary, topic string, partition int, offset long, timestamp timestamp, "
              "timestampType int")
HEADERS_DDL = "headers array<struct<key: string, value: binary>>"
ROWS_PER_BATCH = 8192
BYTES_PER_BATCH = 64 << 20  # bounds a worker's memory and keeps binary columns far below Arrow's 2 GiB offsets


def schema_ddl(include_headers: bool) -> str:
    return f"{SCHEMA_DDL}, {HEADERS_DDL}" if include_headers else SCHEMA_DDL


class Columns:
    """Column lists for one Arrow batch."""

    __slots__ = ("headers", "keys", "nbytes", "offsets", "timestamps", "ts_types", "values")

    def __init__(self) -> None:
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.nbytes = 0  # record bytes decoded into these columns (bounds one Arrow batch)
        self.offsets: list[int] = []
        self.timestamps: list[int] = []
        self.ts_types: list[int] = []
        self.headers: list[list[tuple[str, bytes | None]]] = []

    def __len__(self) -> int:
        return len(self.offsets)


def _varint(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    """Zigzag varint at `pos` → (value, next position)."""
    b = buf[pos]
    pos += 1
    result = b & 0x7F
    shift = 7
    while b & 0x80:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        shift += 7
        if shift > 63:
            raise ProtocolError("varint longer than 10 bytes")
    return (result >> 1) ^ -(result & 1), pos


def decode_batch_into(batch: RecordBatch, cols: Columns, start: int, end: int, want_headers: bool) -> None:
    """Append the records of `batch` with start ≤ offset < end to `cols`."""
    (base_offset, _, _, magic, _, attributes, _, base_ts, max_ts, _, _, _, count) = batch.header()
    if magic != 2:
        raise ProtocolError(f"batch at {base_offset}: magic {magic}, only v2 batches are read")
    data: bytes | memoryview = batch.buf[batch.pos + HEADER_SIZE:batch.pos + batch.size]
    codec = attributes & 0x07
    if codec != compression.NONE:
        data = compression.decompress(codec, data)
    buf = bytes(data)  # indexing bytes is much faster than a memoryview
    cols.nbytes += len(buf)
    log_append = bool(attributes & 0x08)
    ts_type = 1 if log_append else 0
    keys, values, offsets, timestamps = cols.keys, cols.values, cols.offsets, cols.timestamps
    pos, n = 0, len(buf)
    # varints inlined with one- and two-byte fast paths: this loop is the reader's hot spot
    for _ in range(count):
        b = buf[pos]
        if b < 0x80:
            length, pos = (b >> 1) ^ -(b & 1), pos + 1
        elif buf[pos + 1] < 0x80:
            b = (b & 0x7F) | (buf[pos + 1] << 7)
            length, pos = (b >> 1) ^ -(b & 1), pos + 2
        else:
            length, pos = _varint(buf, pos)
        rec_end = pos + length
        if length < 0 or rec_end > n:
            raise ProtocolError(f"batch at {base_offset}: record length runs past the batch")
        pos += 1  # attributes
        b = buf[pos]
        if b < 0x80:
            ts_delta, pos = (b >> 1) ^ -(b & 1), pos + 1
        elif buf[pos + 1] < 0x80:
            b = (b & 0x7F) | (buf[pos + 1] << 7)
            ts_delta, pos = (b >> 1) ^ -(b & 1), pos + 2
        else:
            ts_delta, pos = _varint(buf, pos)
        b = buf[pos]
        if b < 0x80:
            off_delta, pos = (b >> 1) ^ -(b & 1), pos + 1
        elif buf[pos + 1] < 0x80:
            b = (b & 0x7F) | (buf[pos + 1] << 7)
            off_delta, pos = (b >> 1) ^ -(b & 1), pos + 2
        else:
            off_delta, pos = _varint(buf, pos)
        offset = base_offset + off_delta
        if offset < start or offset >= end:
            pos = rec_end
            continue
        b = buf[pos]
        if b < 0x80:
            klen, pos = (b >> 1) ^ -(b & 1), pos + 1
        elif buf[pos + 1] < 0x80:
            b = (b & 0x7F) | (buf[pos + 1] << 7)
            klen, pos = (b >> 1) ^ -(b & 1), pos + 2
        else:
            klen, pos = _varint(buf, pos)
        if klen >= 0:
            key: bytes | None = buf[pos:pos + klen]
            pos += klen
        else:
            key = None
        b = buf[pos]
        if b < 0x80:
            vlen, pos = (b >> 1) ^ -(b & 1), pos + 1
        elif buf[pos + 1] < 0x80:
            b = (b & 0x7F) | (buf[pos + 1] << 7)
            vlen, pos = (b >> 1) ^ -(b & 1), pos + 2
        else:
            vlen, pos = _varint(buf, pos)
        if vlen >= 0:
            value: bytes | None = buf[pos:pos + vlen]
            pos += vlen
        else:
            value = None
        if want_headers:
            hcount, pos = _varint(buf, pos)
            hs = []
            for _ in range(hcount):
                hklen, pos = _varint(buf, pos)
                if hklen < 0:
                    raise ProtocolError(f"batch at {base_offset}: null header key")
                hkey = buf[pos:pos + hklen].decode("utf-8", "replace")
                pos += hklen
                hvlen, pos = _varint(buf, pos)
                hval = buf[pos:pos + hvlen] if hvlen >= 0 else None
                pos += max(hvlen, 0)
                hs.append((hkey, hval))
            cols.headers.append(hs)
        if pos > rec_end:
            raise ProtocolError(f"batch at {base_offset}: record fields run past the record length")
        pos = rec_end
        keys.append(key)
        values.append(value)
        offsets.append(offset)
        timestamps.append(max_ts if log_append else base_ts + ts_delta)
    cols.ts_types.extend([ts_type] * (len(offsets) - len(cols.ts_types)))


def visible_batches(batches: Iterable[RecordBatch], read_committed: bool,
                    aborted: list[tuple[int, int]]) -> Iterator[RecordBatch]:
    """Data batches a consumer with this isolation level sees (control batches never; aborted ones with
    read_committed). `aborted` holds (producer id, first offset) of aborted transactions overlapping the range; it
    may grow while batches are read (a live read appends what each fetch response reports, before its batches)."""
    heap: list[tuple[int, int]] = []
    taken = 0
    aborted_pids: set[int] = set()
    for b in batches:
        pid = b.producer_id
        if read_committed and pid >= 0:
            if taken < len(aborted):
                for producer, first in aborted[taken:]:
                    heapq.heappush(heap, (first, producer))
                taken = len(aborted)
            last = b.last_offset
            while heap and heap[0][0] <= last:
                aborted_pids.add(heapq.heappop(heap)[1])
            if b.is_control:
                if b.control_record().type == ABORT:
                    aborted_pids.discard(pid)
                continue
            if b.is_transactional and pid in aborted_pids:
                continue
        elif b.is_control:
            continue
        yield b


def arrow_batches(batches: Iterable[RecordBatch], *, topic: str, partition: int, start: int, end: int,
                  include_headers: bool, read_committed: bool, aborted: list[tuple[int, int]],
                  schema: Any, rows_per_batch: int = ROWS_PER_BATCH,
                  bytes_per_batch: int = BYTES_PER_BATCH) -> Iterator[Any]:
    """Arrow record batches of the records with start ≤ offset < end, in `schema` (Spark's expected Arrow schema)."""
    import pyarrow as pa  # type: ignore[import-untyped]

    def emit(cols: Columns) -> Any:
        n = len(cols)
        arrays = [pa.array(cols.keys, pa.binary()), pa.array(cols.values, pa.binary()),
                  pa.array([topic] * n, pa.string()), pa.array([partition] * n, pa.int32()),
                  pa.array(cols.offsets, pa.int64()),
                  pa.array(cols.timestamps, pa.int64()).cast(pa.timestamp("ms")).cast(schema.field(5).type),
                  pa.array(cols.ts_types, pa.int32())]
        if include_headers:
            # a record without headers has null headers, as in Spark's Kafka source
            arrays.append(pa.array([[{"key": k, "value": v} for k, v in hs] if hs else None for hs in cols.headers],
                                   schema.field(7).type))
        return pa.RecordBatch.from_arrays(arrays, schema=schema)

    cols = Columns()
    for b in visible_batches(batches, read_committed, aborted):
        if b.base_offset >= end:
            break
        if b.last_offset < start:
            continue
        decode_batch_into(b, cols, start, end, include_headers)
        if len(cols) >= rows_per_batch or cols.nbytes >= bytes_per_batch:
            yield emit(cols)
            cols = Columns()
    if len(cols):
        yield emit(cols)
