"""protocol.requests: the bodies tierproxy sends encode at every version they are sent with and read back whole."""

from __future__ import annotations

import pytest

from protocol import registry
from protocol.constants import ApiKey, ErrorCode, IsolationLevel, OffsetSpec
from protocol.headers import RequestHeader, decode_request_header
from protocol.requests import PARTITION_BOUNDS, fetch_request, list_offsets_request, listed_offsets


def _round_trip(api_key: int, version: int, body: dict[str, object]) -> dict[str, object]:
    hv = 2 if version >= (12 if api_key == ApiKey.FETCH else 6) else 1
    frame = b"".join(bytes(c) for c in registry.encode_request(RequestHeader(api_key, version, 7, "t", hv, 0), body))
    view = memoryview(frame)[4:]
    return registry.decode_request(decode_request_header(view), view)


@pytest.mark.parametrize("version", range(4, 13))
def test_fetch_request_reads_back_at_every_by_name_version(version: int) -> None:
    body = fetch_request({"a": {0: 5, 3: 9}, "b": {1: 0}}, max_bytes=1 << 20, partition_max_bytes=4096,
                         max_wait_ms=250, min_bytes=1, isolation=IsolationLevel.READ_COMMITTED)
    got = _round_trip(ApiKey.FETCH, version, body)
    assert (got["replica_id"], got["max_wait_ms"], got["min_bytes"], got["max_bytes"]) == (-1, 250, 1, 1 << 20)
    assert got["isolation_level"] == 1
    assert {(t["topic"], p["partition"], p["fetch_offset"], p["partition_max_bytes"])
            for t in got["topics"] for p in t["partitions"]} == {("a", 0, 5, 4096), ("a", 3, 9, 4096),
                                                                  ("b", 1, 0, 4096)}
    if version >= 7:
        assert (got["session_id"], got["session_epoch"]) == (0, -1)  # no fetch session: a full fetch each time


def test_fetch_request_partition_max_defaults_to_max_bytes() -> None:
    body = fetch_request({"a": {0: 0}}, max_bytes=1234)
    assert body["topics"][0]["partitions"][0]["partition_max_bytes"] == 1234
    assert body["isolation_level"] == IsolationLevel.READ_UNCOMMITTED


@pytest.mark.parametrize("version", range(1, 11))
def test_list_offsets_request_reads_back_at_every_version(version: int) -> None:
    body = list_offsets_request({"a": {0: OffsetSpec.EARLIEST, 2: 1_700_000_000_000}},
                                isolation=IsolationLevel.READ_COMMITTED, timeout_ms=1500)
    got = _round_trip(ApiKey.LIST_OFFSETS, version, body)
    assert got["replica_id"] == -1
    assert [(p["partition_index"], p["timestamp"]) for p in got["topics"][0]["partitions"]] == [
        (0, -2), (2, 1_700_000_000_000)]
    assert got["isolation_level"] == (1 if version >= 2 else 0)  # the field exists from v2
    assert got.get("timeout_ms", 0) == (1500 if version >= 10 else 0)


def test_listed_offsets_keeps_only_answered_partitions() -> None:
    response = {"topics": [{"name": "a", "partitions": [
        {"partition_index": 0, "error_code": ErrorCode.NONE, "offset": 42},
        {"partition_index": 1, "error_code": ErrorCode.NOT_LEADER_OR_FOLLOWER, "offset": -1}]}]}
    assert listed_offsets(response) == {("a", 0): 42}


def test_partition_bounds_are_log_start_lso_and_high_watermark() -> None:
    assert [(n, int(i), int(s)) for n, i, s in PARTITION_BOUNDS] == [
        ("log_start", 0, -2), ("last_stable", 1, -1), ("high_watermark", 0, -1)]


def test_request_client_numbers_requests_and_matches_responses_in_order() -> None:
    from protocol.client import RequestClient

    client = RequestClient("me")
    first = b"".join(bytes(c) for c in client.send(ApiKey.LIST_OFFSETS, 7, list_offsets_request({"a": {0: -1}})))
    client.send(ApiKey.LIST_OFFSETS, 7, list_offsets_request({"a": {1: -1}}))
    view = memoryview(first)[4:]
    header = decode_request_header(view)
    assert (header.correlation_id, header.client_id) == (1, "me")
    answers = b"".join(
        bytes(c) for cid, offset in ((1, 10), (2, 20)) for c in registry.encode_response(
            ApiKey.LIST_OFFSETS, 7, cid, {"throttle_time_ms": 0, "topics": [{"name": "a", "partitions": [
                {"partition_index": cid - 1, "error_code": 0, "timestamp": -1, "offset": offset,
                 "leader_epoch": 0}]}]}))
    region = client.get_buffer(len(answers))
    n = min(len(region), len(answers))
    region[:n] = answers[:n]
    client.buffer_updated(n)
    client.receive_data(answers[n:])
    got = []
    while (ev := client.next_event()) is not None:
        got.append((ev.correlation_id, listed_offsets(client.decode(ev))))
    assert got == [(1, {("a", 0): 10}), (2, {("a", 1): 20})]
