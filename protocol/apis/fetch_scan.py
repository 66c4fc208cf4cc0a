"""A Fetch response scan: each partition's error code, without decoding the response (the tail path's only
question), and whether it carries KIP-951 NodeEndpoints (the only reason to re-encode it); where each erring
partition's entry lies, and the record bytes of the others (what a remote answer splices: `fetch_splice`).

Walks the wire grammar of `protocol.apis.fetch` (versions 4-18), skipping everything else:
    FetchResponse => throttle_time_ms error_code(v7+) session_id(v7+)
                     [topic(v4-12) | topic_id(v13+)
                      [partition_index error_code high_watermark last_stable_offset log_start_offset(v5+)
                       [producer_id first_offset] (nullable) preferred_read_replica(v11+) records (nullable)]]
                     node_endpoints(tag 0, v16+)
    Flexible from v12: compact lengths, and tagged fields after every struct.
A malformed or truncated response raises `ProtocolError`, as a full decode would.

And a Fetch request's KIP-227 session fields, which sit at a fixed place (tagged fields come last):
    FetchRequest => replica_id(v7-14) max_wait_ms min_bytes max_bytes isolation_level session_id session_epoch ...
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from protocol.errors import ProtocolError
from protocol.primitives import Reader

NODE_ENDPOINTS_TAG = 0
# partition_index:int32 error_code:int16 high_watermark:int64 last_stable_offset:int64 log_start_offset:int64 (v5+)
PARTITION_V5 = struct.Struct(">ihqqq")
PARTITION_V4 = struct.Struct(">ihqq")
# session_id:int32 session_epoch:int32, after the request's fixed head
SESSION = struct.Struct(">ii")
# replica_id:int32 (v7-14) max_wait_ms:int32 min_bytes:int32 max_bytes:int32 isolation_level:int8
HEAD_V7, HEAD_V15 = 17, 13
# array count / string length / bytes length of the non-flexible versions
INT32, INT16 = struct.Struct(">i"), struct.Struct(">h")


class PartitionError(NamedTuple):
    topic: str | bytes  # the name up to v12, the topic id from v13
    partition: int
    error_code: int


class FetchScan(NamedTuple):
    errors: list[PartitionError]  # partitions answered with a non-zero error code
    node_endpoints: bool  # a non-empty node_endpoints tagged field is present
    spans: list[tuple[int, int, bool]] = []  # each of `errors`' entry: its bytes' [start, end), tagged fields?
    answered: int = 0  # record bytes of the partitions answered without an error


def fetch_request_session(frame: memoryview, version: int, body_offset: int) -> tuple[int, int, int] | None:
    """A Fetch request's (session_id, session_epoch, position of session_id in `frame`); None before v7 (no
    sessions). Reads nothing past the session fields."""
    if version < 7:
        return None
    at = body_offset + (HEAD_V7 if version < 15 else HEAD_V15)
    if at + SESSION.size > len(frame):
        raise ProtocolError(f"Fetch request of {len(frame)} bytes ends before its session fields", api_key=1,
                            api_version=version)
    session_id, epoch = SESSION.unpack_from(frame, at)
    return session_id, epoch, at


def scan_fetch_response(frame: memoryview, version: int, body_offset: int,
                        keys: list[tuple[str | bytes, int]] | None = None) -> FetchScan:
    """The partition errors of a Fetch response body at `body_offset` in `frame`; `keys`, if given, gets every
    partition's (topic, partition) in the response's order."""
    if not 4 <= version <= 18:
        raise ProtocolError(f"Fetch v{version} is outside the scan's 4-18", api_key=1, api_version=version)
    try:
        return _scan(frame, version, body_offset, keys)
    except (struct.error, IndexError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"malformed Fetch response: {exc}", api_key=1, api_version=version) from None


def _uvarint(buf: memoryview, p: int) -> tuple[int, int]:
    """(value, position after it) of an unsigned varint of more than one byte (one-byte ones are read inline)."""
    value, shift = 0, 0
    while True:
        b = buf[p]
        p += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, p
        shift += 7
        if shift > 63:
            raise ProtocolError("varint too long")


def _skip_tagged(buf: memoryview, p: int, end: int) -> int:
    """The position after a tagged-field section."""
    n = buf[p]
    p += 1
    if n >= 0x80:
        n, p = _uvarint(buf, p - 1)
    for _ in range(n):
        _, p = _uvarint(buf, p)  # tag
        size, p = _uvarint(buf, p)
        p += size
        if p > end:
            raise ProtocolError(f"truncated: a tagged field ends at {p}, past {end}")
    return p


def _truncated(n: int, p: int, end: int) -> ProtocolError:
    return ProtocolError(f"truncated: need {n} bytes at {p}, have {end - p}")


def _length(buf: memoryview, p: int, flexible: bool, fixed: struct.Struct) -> tuple[int, int]:
    """A length or count (compact: an unsigned varint of n + 1; else `fixed`; null reads as -1) and the position
    after it."""
    if flexible:
        n = buf[p]
        p += 1
        if n >= 0x80:
            n, p = _uvarint(buf, p - 1)
        return n - 1, p
    return fixed.unpack_from(buf, p)[0], p + fixed.size


def _count(buf: memoryview, p: int, end: int, flexible: bool) -> tuple[int, int]:
    """An array's item count (null reads as -1: no items) and the position after it."""
    n, p = _length(buf, p, flexible, INT32)
    if n > end - p:
        raise ProtocolError(f"array count {n} exceeds the {end - p} bytes left")
    return n, p


def _scan(buf: memoryview, version: int, p: int, keys: list[tuple[str | bytes, int]] | None) -> FetchScan:
    # straight-line reads on one position `p` (the tail path scans every response: a helper call per array, not
    # per field)
    end = len(buf)
    flexible = version >= 12
    part = PARTITION_V5 if version >= 5 else PARTITION_V4
    part_size = part.size
    p += 4 + (6 if version >= 7 else 0)  # throttle_time_ms, error_code + session_id
    if p > end:
        raise _truncated(0, p, end)
    errors: list[PartitionError] = []
    spans: list[tuple[int, int, bool]] = []
    answered = 0
    topics, p = _count(buf, p, end, flexible)
    for _ in range(topics):
        topic: str | bytes
        if version >= 13:
            if p + 16 > end:
                raise _truncated(16, p, end)
            topic = bytes(buf[p:p + 16])
            p += 16
        else:
            n, p = _length(buf, p, flexible, INT16)
            if n < 0 or p + n > end:
                raise _truncated(n, p, end)
            topic = str(buf[p:p + n], "utf-8")
            p += n
        parts, p = _count(buf, p, end, flexible)
        for _ in range(parts):
            start, tagged = p, False
            partition, error_code = part.unpack_from(buf, p)[:2]
            p += part_size
            aborted, p = _count(buf, p, end, flexible)  # aborted transactions (null: none)
            for _ in range(aborted):  # producer_id, first_offset (and tagged fields)
                p += 16
                if flexible:
                    p = _skip_tagged(buf, p, end)
            if version >= 11:
                p += 4  # preferred_read_replica
            if flexible:
                n = buf[p]
                p += 1
                if n >= 0x80:
                    n, p = _uvarint(buf, p - 1)
                p += max(n - 1, 0)  # records (0: null)
                if p > end:
                    raise _truncated(n - 1, p - n + 1, end)
                if not error_code and n > 1:
                    answered += n - 1
                tagged = buf[p] != 0
                p = _skip_tagged(buf, p, end)
            else:
                n = INT32.unpack_from(buf, p)[0]
                p += 4
                if n < -1:
                    raise ProtocolError(f"bad records length {n}")
                if p + max(n, 0) > end:
                    raise _truncated(n, p, end)
                p += max(n, 0)
                if not error_code and n > 0:
                    answered += n
            if error_code:
                errors.append(PartitionError(topic, partition, error_code))
                spans.append((start, p, tagged))
            if keys is not None:
                keys.append((topic, partition))
        if flexible:
            p = _skip_tagged(buf, p, end)
    endpoints = False
    if flexible:
        tags, p = _uvarint(buf, p)
        for _ in range(tags):
            tag, p = _uvarint(buf, p)
            size, p = _uvarint(buf, p)
            start = p
            p += size
            if p > end:
                raise _truncated(size, start, end)
            if tag == NODE_ENDPOINTS_TAG and version >= 16:
                endpoints = Reader(buf, start, p).compact_array_len() > 0
    if p != end:
        raise ProtocolError(f"{end - p} bytes after the Fetch response", api_key=1, api_version=version)
    return FetchScan(errors, endpoints, spans, answered)
