"""The compaction engine's per-record loops, compiled (numba): a batch's records section scanned, its keys hashed
(MD5) into or looked up in the key map's own table, each record's retain rule, a partly kept batch's records
re-encoded. Each mirrors a Python original exactly — `protocol.records.scan_records` / `rebuilt_body`,
`tier.compaction.offset_map.OffsetMap.put/get`, `tier.compaction.kernel.retain_record` — and the differential tests
hold them together.

Every read is checked against the section's end by hand (numba does not check bounds): corrupt input returns an
error code, which the caller raises as the Python path's ProtocolError; never a read past the buffer.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tierproxy.jobs.tiering.md5 import jit, md5_into

_jit = jit()
_inline = jit(inline="always")

OK, TRUNCATED, PAST_BATCH, LONG_VARINT, KEY_PAST, MAP_FULL, DELTA_PAST_INT = 0, -1, -2, -3, -4, -5, -6
# a record's span, as scan_records' tuple: offset delta, timestamp delta, key start, key length (-1 null),
# has value (0/1), tail start, end
OFF, TS, KEY, KLEN, VALUE, TAIL, END = range(7)
HASH, ENTRY = 16, 24  # a map slot: md5:16 offset:int64 (big-endian)


@_inline
def _uvarint(buf: Any, pos: int, stop: int) -> tuple[Any, int]:
    """An unsigned varint as `protocol.records._uvarint` reads it: (value, next position) or (0, error code)."""
    acc = np.uint64(0)
    shift = np.uint64(0)
    while True:
        if pos >= stop:
            return acc, TRUNCATED
        b = np.uint64(buf[pos])
        pos += 1
        if shift == np.uint64(63) and (b & np.uint64(0x7F)) > np.uint64(1):
            return acc, LONG_VARINT
        acc |= (b & np.uint64(0x7F)) << shift
        if b < np.uint64(0x80):
            return acc, pos
        shift += np.uint64(7)
        if shift > np.uint64(63):
            return acc, LONG_VARINT


@_inline
def _zz(v: Any) -> Any:
    return np.int64(v >> np.uint64(1)) ^ -np.int64(v & np.uint64(1))


@_jit
def scan(buf: Any, pos: int, stop: int, count: int, spans: Any) -> int:
    """scan_records over buf[pos:stop] (`count` records) into spans[:count] (positions relative to `pos`); OK or
    an error code."""
    if count > stop - pos:  # every record takes a byte at least: the Python loop would run out of bytes
        return TRUNCATED
    base = pos
    for i in range(count):
        v, pos = _uvarint(buf, pos, stop)
        if pos < 0:
            return pos
        length = _zz(v)
        if length < 0 or length > stop - pos:  # (not pos + length > stop: that sum can wrap past 2**63)
            return PAST_BATCH
        end = pos + length
        v, p = _uvarint(buf, pos + 1, stop)  # past attributes:int8
        if p < 0:
            return p
        ts = _zz(v)
        v, p = _uvarint(buf, p, stop)
        if p < 0:
            return p
        off = _zz(v)
        if off < -(1 << 31) or off >= 1 << 31:
            return DELTA_PAST_INT
        spans[i, OFF], spans[i, TS], spans[i, TAIL] = off, ts, p - base
        v, p = _uvarint(buf, p, stop)
        if p < 0:
            return p
        klen = _zz(v)
        spans[i, KEY], spans[i, KLEN] = p - base, klen
        # the value's length and the headers' count are the record's too (a byte each at least); klen >= end - p,
        # not p + klen >= end: that sum can wrap past 2**63
        if (klen >= 0 and klen >= end - p) or p >= end:
            return KEY_PAST
        if klen >= 0:
            p += klen
        if p >= stop:
            return TRUNCATED
        spans[i, VALUE] = 1 if buf[p] != 1 else 0  # the value's length: -1 (zigzag 1) is the one byte 0x01
        spans[i, END] = end - base
        pos = end
    return OK


@_inline
def _slot(digest: Any, attempt: int, slots: int) -> Any:
    """OffsetMap._position: the big-endian int at digest[min(attempt, 12)] plus (attempt - 12) past it, as Java
    ints, abs'd (MIN_VALUE: 0) modulo the slots; the slot's byte position."""
    i = min(attempt, HASH - 4)
    v: Any = (np.int64(digest[i]) << 24) | (np.int64(digest[i + 1]) << 16) | (np.int64(digest[i + 2]) << 8) \
        | np.int64(digest[i + 3])
    v = v - (1 << 32) if v >= (1 << 31) else v
    v += max(0, attempt - HASH + 4)
    v = (v + (1 << 31)) % (1 << 32) - (1 << 31)
    v = 0 if v == -(1 << 31) else abs(v)
    return (v % slots) * ENTRY


@_inline
def _compare(table: Any, at: int, digest: Any) -> int:
    """1: the slot holds `digest`; 0: it is empty; -1: another key's."""
    empty = True
    same = True
    for i in range(HASH):
        t = table[at + i]
        empty = empty and t == 0
        same = same and t == digest[i]
    return 1 if same and not empty else (0 if empty else -1)


@_jit
def put(table: Any, slots: int, digest: Any, offset: int) -> int:
    """OffsetMap.put of a hashed key: 1 a new entry, 0 an entry updated, MAP_FULL when no slot is free."""
    for attempt in range(slots + HASH):
        at = _slot(digest, attempt, slots)
        found = _compare(table, at, digest)
        if found == 1:
            _write_long(table, at + HASH, offset)
            return 0
        if found == 0:
            for i in range(HASH):
                table[at + i] = digest[i]
            _write_long(table, at + HASH, offset)
            return 1
    return MAP_FULL


@_jit
def get(table: Any, slots: int, digest: Any) -> Any:
    """OffsetMap.get of a hashed key: its offset or -1."""
    for attempt in range(slots + HASH - 4):
        at = _slot(digest, attempt, slots)
        found = _compare(table, at, digest)
        if found == 0:
            return -1
        if found == 1:
            v = np.int64(0)
            for i in range(8):
                v = (v << 8) | np.int64(table[at + HASH + i])
            return v
    return -1


@_inline
def _write_long(table: Any, at: int, v: int) -> None:
    for i in range(8):
        table[at + i] = (v >> (56 - 8 * i)) & 0xFF


@_jit
def map_batch(buf: Any, pos: int, stop: int, count: int, base_offset: int, start: int, table: Any, slots: int,
              entries: int, max_entries: int, spans: Any, tail: Any, digest: Any) -> tuple[int, int, int]:
    """PythonKernel.map_batch: (OK, keyed records or -(keyed) - 1 when they would overflow, entries added), or
    (error code, 0, 0) for corrupt input."""
    err = scan(buf, pos, stop, count, spans)
    if err != OK:
        return err, 0, 0
    keyed = 0
    for i in range(count):
        if spans[i, KLEN] >= 0 and base_offset + spans[i, OFF] >= start:
            keyed += 1
    if keyed and entries + keyed > max_entries:
        return OK, -keyed - 1, 0
    added = 0
    for i in range(count):
        if spans[i, KLEN] >= 0 and base_offset + spans[i, OFF] >= start:
            md5_into(buf, pos + spans[i, KEY], spans[i, KLEN], tail, digest)
            r = put(table, slots, digest, base_offset + spans[i, OFF])
            if r < 0 or entries + added + r > slots:
                return MAP_FULL, 0, 0
            added += r
    return OK, keyed, added


@_jit
def retain(buf: Any, pos: int, stop: int, count: int, base_offset: int, horizon_ms: int, has_horizon: bool,
           now_ms: int, latest: int, table: Any, slots: int, spans: Any, tail: Any, digest: Any,
           keep: Any) -> tuple[int, int]:
    """PythonKernel.retain: keep[i] for each record by `retain_record`; (records kept, whether one is a
    tombstone), or (error code, 0)."""
    err = scan(buf, pos, stop, count, spans)
    if err != OK:
        return err, 0
    kept = 0
    tombstones = 0
    for i in range(count):
        offset = base_offset + spans[i, OFF]
        klen = spans[i, KLEN]
        mapped = -1
        if latest >= offset and klen >= 0:
            md5_into(buf, pos + spans[i, KEY], klen, tail, digest)
            mapped = get(table, slots, digest)
        # tier.compaction.kernel.retain_record, spelled out
        if offset > latest:
            k = True
        elif klen < 0 or offset < mapped:
            k = False
        else:
            k = spans[i, VALUE] == 1 or not has_horizon or now_ms < horizon_ms
        keep[i] = k
        if k:
            kept += 1
            if spans[i, VALUE] == 0:
                tombstones = 1
    return kept, tombstones


@_inline
def _put_uvarint(out: Any, at: int, v: Any) -> int:
    while v > np.uint64(0x7F):
        out[at] = (v & np.uint64(0x7F)) | np.uint64(0x80)
        v >>= np.uint64(7)
        at += 1
    out[at] = v
    return at + 1


@_inline
def _zigzag(v: int) -> Any:
    return np.uint64((v << 1) ^ (v >> 63))


@_jit
def rebuild(buf: Any, pos: int, count: int, spans: Any, keep: Any, log_append: bool, base_timestamp: int,
            max_timestamp: int, horizon_ms: int, out: Any) -> tuple[int, int, int]:
    """protocol.records.rebuilt_body of the kept records into `out` (at least the section's size plus 21 bytes a
    record): (its length, the base timestamp, the max timestamp)."""
    base_ts = horizon_ms
    max_ts = max_timestamp
    first = True
    for i in range(count):
        if keep[i]:
            ts = max_timestamp if log_append else base_timestamp + spans[i, TS]
            if first and horizon_ms < 0:
                base_ts = ts
            if not log_append and (first or ts > max_ts):
                max_ts = ts
            first = False
    head = np.empty(16, dtype=np.uint8)
    at = 0
    for i in range(count):
        if not keep[i]:
            continue
        ts = max_timestamp if log_append else base_timestamp + spans[i, TS]
        head[0] = 0
        n = _put_uvarint(head, 1, _zigzag(ts - base_ts))
        n = _put_uvarint(head, n, _zigzag(spans[i, OFF]) & np.uint64(0xFFFFFFFF))
        rest = spans[i, END] - spans[i, TAIL]
        at = _put_uvarint(out, at, _zigzag(n + rest) & np.uint64(0xFFFFFFFF))
        for j in range(n):
            out[at + j] = head[j]
        at += n
        src = pos + spans[i, TAIL]
        for j in range(rest):  # (the Spark reader's memcpy intrinsic is in a layer above this one)
            out[at + j] = buf[src + j]
        at += rest
    return at, base_ts, max_ts
