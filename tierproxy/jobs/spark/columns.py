"""Column buffers for one Arrow batch of rows in the schema of Spark's Kafka source, filled batch by batch by the
compiled kernel and handed to Arrow without another copy (numpy buffers become Arrow buffers as they are)."""

from __future__ import annotations

from typing import Any

import numpy as np

from protocol import compression
from protocol.errors import ProtocolError
from protocol.records import HEADER_SIZE, TIMESTAMP_TYPE_BIT, RecordBatch
from tierproxy.jobs.spark import kernel

_MIN_ROWS, _MIN_BYTES = 1024, 1 << 20
_MAX_DATA = (1 << 31) - 1  # Arrow binary columns use int32 offsets
_GROW_LIMIT = 64  # doublings before a batch is given up on (capacities only grow toward what the input needs)


class RecordColumns:
    """Rows decoded so far for one Arrow batch. Buffers are sized like `like`'s contents (the reader's previous
    batch), with slack, so most batches never grow them."""

    def __init__(self, want_headers: bool, like: RecordColumns | None = None) -> None:
        self.want_headers = want_headers
        self.counts = np.zeros(6, np.int64)

        def size(i: int, least: int, wanted: bool = True) -> int:
            if not wanted:
                return 0
            return max(least, int(like.counts[i]) * 9 // 8) if like is not None else least

        rows = size(kernel.ROWS, _MIN_ROWS)
        self.offsets = np.empty(rows, np.int64)
        self.timestamps = np.empty(rows, np.int64)
        self.ts_types = np.empty(rows, np.int32)
        self.key_ends = np.empty(rows, np.int32)
        self.key_valid = np.empty(rows, np.bool_)
        self.key_data = np.empty(size(kernel.KEY_BYTES, _MIN_BYTES), np.uint8)
        self.value_ends = np.empty(rows, np.int32)
        self.value_valid = np.empty(rows, np.bool_)
        self.value_data = np.empty(size(kernel.VALUE_BYTES, _MIN_BYTES), np.uint8)
        self.header_ends = np.empty(rows if want_headers else 0, np.int32)
        headers = size(kernel.HEADERS, _MIN_ROWS, want_headers)
        self.hkey_ends = np.empty(headers, np.int32)
        self.hkey_data = np.empty(size(kernel.HEADER_KEY_BYTES, _MIN_BYTES, want_headers), np.uint8)
        self.hvalue_ends = np.empty(headers, np.int32)
        self.hvalue_valid = np.empty(headers, np.bool_)
        self.hvalue_data = np.empty(size(kernel.HEADER_VALUE_BYTES, _MIN_BYTES, want_headers), np.uint8)

    def __len__(self) -> int:
        return int(self.counts[kernel.ROWS])

    @property
    def nbytes(self) -> int:
        """Key and value bytes held (bounds one Arrow batch)."""
        return int(self.counts[kernel.KEY_BYTES] + self.counts[kernel.VALUE_BYTES])

    def decode(self, batch: RecordBatch, start: int, end: int) -> None:
        """Append the records of `batch` with start ≤ offset < end (decompressed first if need be)."""
        h = batch.header()
        if h.magic != 2:
            raise ProtocolError(f"batch at {h.base_offset}: magic {h.magic}, only v2 batches are read")
        first, stop = batch.pos + HEADER_SIZE, batch.pos + batch.size
        if stop > len(batch.buf) or h.records_count < 0:
            raise ProtocolError(f"batch at {h.base_offset}: truncated")
        section: Any = batch.buf
        if h.attributes & 0x07:
            try:
                section = compression.decompress(h.attributes & 0x07, batch.buf[first:stop])
            except ProtocolError as exc:
                raise ProtocolError(f"batch at {h.base_offset}: {exc}") from None
            first, stop = 0, len(section)
        buf = np.frombuffer(section, np.uint8)
        log_append = h.attributes & TIMESTAMP_TYPE_BIT
        for _ in range(_GROW_LIMIT):
            got = kernel.decode_records(
                buf, first, stop, h.records_count, h.base_offset, h.base_timestamp,
                h.max_timestamp if log_append else -1, 1 if log_append else 0, start, end, self.want_headers,
                self.counts, self.offsets, self.timestamps, self.ts_types, self.key_ends, self.key_valid,
                self.key_data, self.value_ends, self.value_valid, self.value_data, self.header_ends, self.hkey_ends,
                self.hkey_data, self.hvalue_ends, self.hvalue_valid, self.hvalue_data)
            if got == kernel.OK:
                return
            if got == kernel.CORRUPT:
                raise ProtocolError(f"batch at {h.base_offset}: a record runs past its length or the batch")
            self._grow(h.records_count, stop - first)
        raise ProtocolError(f"batch at {h.base_offset}: needs more buffer than {_MAX_DATA} bytes")  # pragma: no cover

    def _grow(self, records: int, section: int) -> None:
        """Make room for a whole section more: `records` rows, `section` bytes in each data buffer (an upper bound:
        keys, values and headers are parts of it)."""
        c = self.counts
        rows = int(c[kernel.ROWS]) + records
        for name in ("offsets", "timestamps", "ts_types", "key_ends", "key_valid", "value_ends", "value_valid"):
            setattr(self, name, _at_least(getattr(self, name), rows))
        self.key_data = _at_least(self.key_data, int(c[kernel.KEY_BYTES]) + section)
        self.value_data = _at_least(self.value_data, int(c[kernel.VALUE_BYTES]) + section)
        if self.want_headers:
            self.header_ends = _at_least(self.header_ends, rows)
            headers = int(c[kernel.HEADERS]) + section // 2 + 1  # a header takes at least two bytes
            for name in ("hkey_ends", "hvalue_ends", "hvalue_valid"):
                setattr(self, name, _at_least(getattr(self, name), headers))
            self.hkey_data = _at_least(self.hkey_data, int(c[kernel.HEADER_KEY_BYTES]) + section)
            self.hvalue_data = _at_least(self.hvalue_data, int(c[kernel.HEADER_VALUE_BYTES]) + section)
        if max(self.key_data.size, self.value_data.size, self.hkey_data.size, self.hvalue_data.size) > _MAX_DATA:
            raise ProtocolError(f"one Arrow batch would hold more than {_MAX_DATA} bytes in a column")

    def to_arrow(self, topic: str, partition: int, schema: Any) -> Any:
        """An Arrow record batch in `schema` (Spark's expected Arrow schema for the source's columns)."""
        import pyarrow as pa

        n = len(self)
        c = self.counts
        arrays = [
            _binary(pa, n, self.key_ends, self.key_valid, self.key_data, int(c[kernel.KEY_BYTES])),
            _binary(pa, n, self.value_ends, self.value_valid, self.value_data, int(c[kernel.VALUE_BYTES])),
            _constant_string(pa, n, topic),
            pa.array(np.full(n, partition, np.int32)),
            pa.array(self.offsets[:n]),
            pa.array(self.timestamps[:n] * 1000, pa.timestamp("us")).cast(schema.field(5).type),
            pa.array(self.ts_types[:n]),
        ]
        if self.want_headers:
            arrays.append(self._headers(pa, n, schema.field(7).type))
        return pa.RecordBatch.from_arrays(arrays, schema=schema)

    def _headers(self, pa: Any, n: int, type_: Any) -> Any:
        nh = int(self.counts[kernel.HEADERS])
        keys = _utf8(pa, nh, self.hkey_ends, self.hkey_data, int(self.counts[kernel.HEADER_KEY_BYTES]))
        values = _binary(pa, nh, self.hvalue_ends, self.hvalue_valid, self.hvalue_data,
                         int(self.counts[kernel.HEADER_VALUE_BYTES]))
        structs = pa.StructArray.from_arrays([keys, values], fields=list(type_.value_type))
        ends = np.zeros(n + 1, np.int32)
        ends[1:] = self.header_ends[:n]
        # a record without headers has null headers, as in Spark's Kafka source
        none = np.diff(ends) == 0
        return pa.ListArray.from_arrays(pa.array(ends), structs, type=type_, mask=pa.array(none))


def _at_least(a: Any, n: int) -> Any:
    if a.size >= n:
        return a
    grown = np.empty(max(n, 2 * a.size), a.dtype)
    grown[:a.size] = a
    return grown


def _buffers(pa: Any, n: int, ends: Any, data: Any, used: int) -> tuple[Any, Any]:
    offsets = np.zeros(n + 1, np.int32)
    offsets[1:] = ends[:n]
    return pa.py_buffer(offsets), pa.py_buffer(data[:used])


def _binary(pa: Any, n: int, ends: Any, valid: Any, data: Any, used: int) -> Any:
    offsets, values = _buffers(pa, n, ends, data, used)
    nulls = n - int(np.count_nonzero(valid[:n]))
    bitmap = pa.py_buffer(np.packbits(valid[:n], bitorder="little")) if nulls else None
    return pa.Array.from_buffers(pa.binary(), n, [bitmap, offsets, values], null_count=nulls)


def _utf8(pa: Any, n: int, ends: Any, data: Any, used: int) -> Any:
    offsets, values = _buffers(pa, n, ends, data, used)
    keys = pa.Array.from_buffers(pa.string(), n, [None, offsets, values], null_count=0)
    try:
        keys.validate(full=True)
    except pa.ArrowInvalid as exc:
        raise ProtocolError(f"a header key is not UTF-8: {exc}") from None
    return keys


def _constant_string(pa: Any, n: int, s: str) -> Any:
    b = s.encode()
    offsets = np.arange(n + 1, dtype=np.int32) * len(b)
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(b * n)],
                                 null_count=0)
