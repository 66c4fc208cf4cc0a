"""A record set as a file region (`FileRegion`): the codec writes its length and passes it on as its own chunk, so
the response is the same frame the bytes themselves would make once the region's bytes stand in its place; where
the bytes themselves are needed (a joined frame, a field that is not a record set) it refuses with ProtocolError."""

from __future__ import annotations

import os
from typing import Any

import pytest

from protocol import registry
from protocol.constants import ApiKey
from protocol.errors import ProtocolError
from protocol.primitives import FileRegion, Writer
from protocol.records import Record, build_batch


def _response(records: bytes | FileRegion) -> dict[str, Any]:
    return {"throttle_time_ms": 0, "error_code": 0, "session_id": 0, "node_endpoints": [], "responses": [
        {"topic": "t", "topic_id": bytes(16), "partitions": [
            {"partition_index": 0, "error_code": 0, "high_watermark": 10, "last_stable_offset": 10,
             "log_start_offset": 0, "diverging_epoch": None, "current_leader": None, "snapshot_id": None,
             "aborted_transactions": None, "preferred_read_replica": -1, "records": records}]}]}


@pytest.mark.parametrize("version", [4, 11, 12, 13, 16])
@pytest.mark.parametrize("size", [1, 3, 40])
def test_a_region_encodes_as_its_bytes_would(version: int, size: int) -> None:
    batch = b"".join(build_batch([Record(i, 0, None, os.urandom(30))], base_offset=i) for i in range(size))
    fd = os.memfd_create("segment")
    try:
        os.write(fd, b"x" * 7 + batch)
        region = FileRegion(fd, 7, len(batch))
        chunks = registry.encode_response(ApiKey.FETCH, version, 9, _response(region))
        assert sum(isinstance(c, FileRegion) for c in chunks) == 1
        filled = b"".join(os.pread(c.fd, c.length, c.position) if isinstance(c, FileRegion) else bytes(c)
                          for c in chunks)
        assert filled == registry.joined(registry.encode_response(ApiKey.FETCH, version, 9, _response(batch)))
        with pytest.raises(ProtocolError):
            registry.joined(chunks)
    finally:
        os.close(fd)


def test_a_region_is_refused_where_a_field_is_not_a_record_set() -> None:
    w = Writer()
    with pytest.raises(ProtocolError):
        w.bytes_(FileRegion(0, 0, 10), compact=True, zero_copy=False)
