"""Codec benchmark: decode + re-encode a Fetch response of 100 partitions x 1 MiB without copying records.

Run with `make bench` (or `pytest -m bench tests/bench/test_codec_bench.py -s`). Prints GB/s equivalent:
the bytes of the frame divided by the time to decode its header/body and re-encode it into write chunks.
"""

from __future__ import annotations

import time

import pytest

from protocol import registry
from protocol.records import Record, build_batch
from tests.bench.report import report

pytestmark = pytest.mark.bench

PARTITIONS = 100
RECORD_SET = 1 << 20


def _frame(version: int) -> bytes:
    batch = build_batch([Record(i, 1_700_000_000_000, None, bytes(1000)) for i in range(1000)])
    records = (batch * (RECORD_SET // len(batch) + 1))[:RECORD_SET]
    data = {"throttle_time_ms": 0, "error_code": 0, "session_id": 0, "responses": [
        {"topic": "bench", "topic_id": bytes(range(16)), "partitions": [
            {"partition_index": p, "error_code": 0, "high_watermark": 10**9, "last_stable_offset": 10**9,
             "log_start_offset": 0, "aborted_transactions": None, "preferred_read_replica": -1,
             "records": records} for p in range(PARTITIONS)]}]}
    return registry.joined(registry.encode_response(1, version, 1, data))[4:]


@pytest.mark.parametrize("version", [12, 16])
def test_fetch_response_decode_encode_zero_copy(version: int) -> None:
    frame = bytearray(_frame(version))
    view = memoryview(frame)
    rounds = 20
    start = time.perf_counter()
    for _ in range(rounds):
        data = registry.decode_response(1, version, view, 5)  # header v1: correlation id + tags
        chunks = registry.encode_response(1, version, 1, data)
    elapsed = time.perf_counter() - start
    parts = data["responses"][0]["partitions"]
    assert all(p["records"].obj is frame for p in parts)  # decoded records are views of the frame
    record_chunks = [c for c in chunks if isinstance(c, memoryview)]
    assert len(record_chunks) == PARTITIONS and all(c.obj is frame for c in record_chunks)  # and so is the output
    assert sum(len(c) for c in chunks) == len(frame) + 4
    gbps = len(frame) * rounds / elapsed / 1e9
    report(f"codec Fetch v{version} 100x1MiB decode+encode", f"{gbps:.1f} GB/s equivalent "
           f"({elapsed / rounds * 1e3:.2f} ms per {len(frame) / 1e6:.0f} MB frame)")
    assert gbps >= 1.0
