"""The Fetch response scan agrees with the full decode on every version, and raises ProtocolError where the
decode would (Hypothesis: it decodes or raises ProtocolError)."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import registry
from protocol.apis.fetch_scan import PartitionError, fetch_request_session, scan_fetch_response
from protocol.constants import ApiKey
from protocol.errors import ProtocolError
from protocol.headers import RequestHeader, decode_request_header, request_header_version
from tests.support.samples import sample

FETCH = registry.SUPPORTED[ApiKey.FETCH]


def encoded(data: dict[str, object], version: int) -> tuple[memoryview, int]:
    raw = registry.joined(registry.encode_response(ApiKey.FETCH, version, 9, data))
    frame = memoryview(raw)[4:]
    return frame, 5 if version >= 12 else 4  # correlation id (+ tagged fields when flexible)


def expected(data: dict[str, object], version: int) -> list[PartitionError]:
    key = "topic_id" if version >= 13 else "topic"
    return [PartitionError(t[key], p["partition_index"], p["error_code"])  # type: ignore[index]
            for t in data["responses"] for p in t["partitions"] if p["error_code"]]  # type: ignore[attr-defined]


@pytest.mark.parametrize("version", range(4, 19))
@pytest.mark.parametrize("seed", range(6))
def test_scan_matches_the_full_decode(version: int, seed: int) -> None:
    data = sample(FETCH.response, version, seed=seed)  # type: ignore[arg-type]
    if seed % 2:  # half the samples: some partitions without error, null aborted transactions and records
        for t in data["responses"]:
            for p in t["partitions"][::2]:
                p["error_code"], p["aborted_transactions"], p["records"] = 0, None, None
    if version >= 16 and seed == 3:
        data["node_endpoints"] = []
    frame, body = encoded(data, version)
    scan = scan_fetch_response(frame, version, body)
    decoded = registry.decode_response(ApiKey.FETCH, version, frame, body)
    assert scan.errors == expected(decoded, version)
    assert scan.node_endpoints == bool(version >= 16 and decoded.get("node_endpoints"))


@pytest.mark.parametrize("version", [4, 11, 12, 13, 16, 18])
def test_a_truncated_response_or_trailing_bytes_raise(version: int) -> None:
    frame, body = encoded(sample(FETCH.response, version), version)  # type: ignore[arg-type]
    for cut in range(body, len(frame), max(1, (len(frame) - body) // 40)):
        with pytest.raises(ProtocolError):
            scan_fetch_response(frame[:cut], version, body)
    with pytest.raises(ProtocolError):
        scan_fetch_response(memoryview(bytes(frame) + b"\x00"), version, body)


@settings(max_examples=300, deadline=None)
@given(st.integers(4, 18), st.binary(max_size=200))
def test_scans_or_raises_protocol_error(version: int, junk: bytes) -> None:
    with contextlib.suppress(ProtocolError):  # anything else (IndexError, UnicodeError...) fails the test
        scan = scan_fetch_response(memoryview(junk), version, 0)
        assert all(e.error_code != 0 for e in scan.errors)


@pytest.mark.parametrize("version", range(4, 19))
@pytest.mark.parametrize("seed", range(4))
def test_request_session_fields_match_the_full_decode(version: int, seed: int) -> None:
    data = sample(FETCH.request, version, seed=seed)  # type: ignore[arg-type]
    header = RequestHeader(ApiKey.FETCH, version, 3, "c", request_header_version(ApiKey.FETCH, version), 0)
    frame = memoryview(b"".join(bytes(c) for c in registry.encode_request(header, data)))[4:]
    body = decode_request_header(frame).body_offset
    got = fetch_request_session(frame, version, body)
    if version < 7:
        assert got is None
        return
    assert got is not None
    decoded = registry.decode_request(decode_request_header(frame), frame)
    assert got[:2] == (decoded["session_id"], decoded["session_epoch"])
    patched = bytearray(frame)  # the position found is the field's: rewriting it there changes only it
    patched[got[2]:got[2] + 8] = bytes.fromhex("00000000ffffffff")
    again = registry.decode_request(decode_request_header(memoryview(patched)), memoryview(patched))
    assert (again["session_id"], again["session_epoch"]) == (0, -1)
    assert {k: v for k, v in again.items() if not k.startswith("session")} == \
        {k: v for k, v in decoded.items() if not k.startswith("session")}
    with pytest.raises(ProtocolError):
        fetch_request_session(frame[:got[2] + 7], version, body)
