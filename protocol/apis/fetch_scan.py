"""A Fetch response scan: each partition's error code, without decoding the response (the tail path's only
question), and whether it carries KIP-951 NodeEndpoints (the only reason to re-encode it).

Walks the wire grammar of `protocol.apis.fetch` (versions 4-18), skipping everything else:
    FetchResponse => throttle_time_ms error_code(v7+) session_id(v7+)
                     [topic(v4-12) | topic_id(v13+)
                      [partition_index error_code high_watermark last_stable_offset log_start_offset(v5+)
                       [producer_id first_offset] (nullable) preferred_read_replica(v11+) records (nullable)]]
                     node_endpoints(tag 0, v16+)
    Flexible from v12: compact lengths, and tagged fields after every struct.
A malformed or truncated response raises `ProtocolError`, as a full decode would.
"""

from __future__ import annotations

from typing import NamedTuple

from protocol.errors import ProtocolError
from protocol.primitives import Reader

NODE_ENDPOINTS_TAG = 0


class PartitionError(NamedTuple):
    topic: str | bytes  # the name up to v12, the topic id from v13
    partition: int
    error_code: int


class FetchScan(NamedTuple):
    errors: list[PartitionError]  # partitions answered with a non-zero error code
    node_endpoints: bool  # a non-empty node_endpoints tagged field is present


def _skip_tagged(r: Reader) -> list[int]:
    tags = []
    for _ in range(r.unsigned_varint()):
        tags.append(r.unsigned_varint())
        r.view(r.unsigned_varint())
    return tags


def scan_fetch_response(frame: memoryview, version: int, body_offset: int) -> FetchScan:
    """The partition errors of a Fetch response body at `body_offset` in `frame`."""
    if not 4 <= version <= 18:
        raise ProtocolError(f"Fetch v{version} is outside the scan's 4-18", api_key=1, api_version=version)
    flexible = version >= 12
    r = Reader(frame, body_offset)
    r.view(4 + (6 if version >= 7 else 0))  # throttle_time_ms, error_code + session_id
    errors: list[PartitionError] = []
    array_len = r.compact_array_len if flexible else r.array_len
    for _ in range(max(0, array_len())):
        topic: str | bytes = r.uuid() if version >= 13 else (r.compact_string() if flexible else r.string())
        for _ in range(max(0, array_len())):
            partition, error_code = r.int32(), r.int16()
            r.view(16 + (8 if version >= 5 else 0))  # high_watermark, last_stable_offset, log_start_offset
            for _ in range(array_len()):  # aborted transactions (-1: null)
                r.view(16)
                if flexible:
                    _skip_tagged(r)
            if version >= 11:
                r.view(4)  # preferred_read_replica
            if flexible:
                r.compact_nullable_bytes_view()
                _skip_tagged(r)
            else:
                r.nullable_bytes_view()
            if error_code:
                errors.append(PartitionError(topic, partition, error_code))
        if flexible:
            _skip_tagged(r)
    endpoints = False
    if flexible:
        n = r.unsigned_varint()
        for _ in range(n):
            tag, size = r.unsigned_varint(), r.unsigned_varint()
            data = r.view(size)
            if tag == NODE_ENDPOINTS_TAG and version >= 16:
                endpoints = Reader(data).compact_array_len() > 0
    if r.remaining():
        raise ProtocolError(f"{r.remaining()} bytes after the Fetch response", api_key=1, api_version=version)
    return FetchScan(errors, endpoints)
