"""Fetch requests reach the broker sessionless (KIP-227 sessions are not forwarded: a fleet of proxies has no
session to share), at every version: a sessionless request passes byte for byte, a full request asking for a
session (epoch 0) differs only in its epoch; each then still gets its answer, and a tail answer passes byte for
byte. The proxy holds sessions itself for clients reading the tier (`tests/core/test_proxy_sessions.py`): an
incremental request of a session it does not hold is refused as a broker refuses it."""

from __future__ import annotations

from typing import Any

import pytest

from protocol import registry
from protocol.constants import ApiKey
from protocol.headers import RequestHeader, request_header_version
from protocol.requests import fetch_request
from tests.support.inprocess import Wire, run
from tests.support.samples import sample

Data = dict[str, Any]
FETCH = registry.SUPPORTED[ApiKey.FETCH]


def request(version: int, session_id: int, epoch: int) -> Data:
    body = fetch_request({"t": {0: 5, 1: 9}}, max_bytes=1 << 20, topic_ids={"t": b"\x07" * 16})
    body["session_id"], body["session_epoch"] = session_id, epoch
    body["forgotten_topics_data"] = [{"topic": "old", "topic_id": b"\x08" * 16, "partitions": [3]}]
    return body


def through(version: int, body: Data) -> tuple[bytes, bytes, Data, bytes, bytes]:
    """(frame the client sent, frame the broker got, what the broker decoded, answer sent, answer received)"""
    async def go() -> tuple[bytes, bytes, Data, bytes, bytes]:
        wire = Wire()
        header = RequestHeader(ApiKey.FETCH, version, 41, "scripted", request_header_version(ApiKey.FETCH, version),
                               0)
        sent = b"".join(bytes(c) for c in registry.encode_request(header, body))
        wire.client_sends_raw(header, sent)
        [(got, frame)] = wire.broker_receives()
        decoded = registry.decode_request(got, memoryview(frame))
        answer = registry.joined(registry.encode_response(
            ApiKey.FETCH, version, got.correlation_id, sample(FETCH.response, version) | {"node_endpoints": []}))
        wire.broker_answers(got, answer)
        [(_, received, _)] = wire.client_receives()
        return sent[4:], frame, decoded, answer[4:], received
    return run(go())  # type: ignore[no-any-return]


@pytest.mark.parametrize("version", range(FETCH.min_version, FETCH.max_version + 1))
def test_a_sessionless_request_and_its_tail_answer_pass_byte_for_byte(version: int) -> None:
    sent, forwarded, _, answer, received = through(version, request(version, 0, -1))
    assert forwarded == sent
    assert received == answer


@pytest.mark.parametrize("version", [v for v in range(FETCH.min_version, FETCH.max_version + 1) if v >= 7])
def test_a_full_request_asking_for_a_session_differs_only_in_its_epoch(version: int) -> None:
    sent, forwarded, decoded, answer, received = through(version, request(version, 0, 0))
    assert (decoded["session_id"], decoded["session_epoch"]) == (0, -1)
    assert len(forwarded) == len(sent)
    assert [i for i in range(len(sent)) if sent[i] != forwarded[i]] == \
        [i for i in range(len(sent)) if forwarded[i] == 0xFF and sent[i] == 0]  # the 4 epoch bytes, 0 → -1
    assert sum(a != b for a, b in zip(sent, forwarded, strict=True)) == 4
    assert received == answer


@pytest.mark.parametrize("version", [v for v in range(FETCH.min_version, FETCH.max_version + 1) if v >= 7])
def test_an_incremental_request_of_a_session_the_proxy_does_not_hold_is_refused(version: int) -> None:
    """A session id the proxy never gave (or gave on another connection, or before a restart): answered
    FETCH_SESSION_ID_NOT_FOUND at once, top-level and without partitions, as a broker does; nothing is forwarded,
    and the client starts again with a full request."""
    async def go() -> Data:
        wire = Wire()
        wire.client_sends(ApiKey.FETCH, version, request(version, 1234, 7))
        assert wire.broker_receives() == []
        [(_, _, got)] = wire.client_receives()
        assert got is not None
        return got

    got = run(go())
    assert (got["error_code"], got["session_id"], got["responses"]) == (70, 0, [])
