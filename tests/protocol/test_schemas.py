"""Every decoded API, every supported version: round trips, whole, byte-by-byte and with trailing bytes."""

from __future__ import annotations

import pytest

from protocol import registry
from protocol.connection import ClientConnection, ServerConnection
from protocol.errors import ProtocolError
from protocol.framing import frame_header
from protocol.headers import RequestHeader, request_header_version
from protocol.schema import Message
from tests.support.samples import normalize, projected, sample

# the proxy's APIs and those only tierproxy's own clients send (`registry.OWN`), each message once
_DECLARED = {id(msg): (s.name, kind, msg) for s in (*registry.SUPPORTED.values(), *registry.OWN.values())
             for kind, msg in (("request", s.request), ("response", s.response)) if msg is not None}
CASES = [(name, kind, msg, v) for name, kind, msg in _DECLARED.values()
         for v in range(msg.min_version, msg.max_version + 1)]
IDS = [f"{name}-{kind}-v{v}" for name, kind, _, v in CASES]


@pytest.mark.parametrize(("name", "kind", "msg", "version"), CASES, ids=IDS)
@pytest.mark.parametrize("nulls", [False, True], ids=["values", "nulls"])
def test_round_trip(name: str, kind: str, msg: Message, version: int, nulls: bool) -> None:
    data = sample(msg, version, nulls=nulls)
    encoded = msg.encode(data, version)
    decoded = msg.decode(memoryview(encoded), version)
    assert msg.encode(decoded, version) == encoded
    assert projected(decoded, data) == normalize(data)


@pytest.mark.parametrize(("name", "kind", "msg", "version"), CASES, ids=IDS)
def test_every_truncation_raises_protocol_error(name: str, kind: str, msg: Message, version: int) -> None:
    encoded = msg.encode(sample(msg, version, seed=1), version)
    for cut in range(len(encoded)):
        with pytest.raises(ProtocolError):
            msg.decode(memoryview(encoded[:cut]), version)
    with pytest.raises(ProtocolError, match="trailing"):
        msg.decode(memoryview(encoded + b"\x00"), version)


def _request_frame(api_key: int, version: int, data: dict[str, object], correlation_id: int) -> bytes:
    header = RequestHeader(api_key, version, correlation_id, "tp-test", request_header_version(api_key, version), 0)
    return b"".join(bytes(c) for c in registry.encode_request(header, data))


PROXY_MESSAGES = {id(m) for s in registry.SUPPORTED.values() for m in (s.request, s.response) if m is not None}
# frames as the proxy's connections decode them: the proxy's APIs only (the others pass through it opaque)
REQUEST_CASES = [c for c in CASES if c[1] == "request" and id(c[2]) in PROXY_MESSAGES]


@pytest.mark.parametrize(("name", "kind", "msg", "version"), REQUEST_CASES,
                         ids=[f"{n}-v{v}" for n, _, _, v in REQUEST_CASES])
@pytest.mark.parametrize("step", [1, 7, 1 << 20], ids=["byte-by-byte", "7-bytes", "whole"])
def test_request_frames_stream(name: str, kind: str, msg: Message, version: int, step: int) -> None:
    frames = [_request_frame(msg.api_key, version, sample(msg, version, seed=i), 100 + i) for i in range(3)]
    trailing = frame_header(1000)[:3]  # the start of a next frame: must stay buffered, not break anything
    stream = b"".join(frames) + trailing
    conn = ServerConnection()
    events = []
    for i in range(0, len(stream), step):
        conn.receive_data(stream[i:i + step])
        while (ev := conn.next_event()) is not None:
            events.append(ev)
    assert [e.header.correlation_id for e in events] == [100, 101, 102]
    for i, ev in enumerate(events):
        assert ev.header.client_id == "tp-test"
        body = registry.decode_request(ev.header, ev.frame)
        assert normalize(body) == normalize(msg.decode(memoryview(frames[i]), version, len(frames[i]) - len(ev.body)))
    assert conn.buffered() == 3


RESPONSE_CASES = [c for c in CASES if c[1] == "response" and id(c[2]) in PROXY_MESSAGES]


@pytest.mark.parametrize(("name", "kind", "msg", "version"), RESPONSE_CASES,
                         ids=[f"{n}-v{v}" for n, _, _, v in RESPONSE_CASES])
@pytest.mark.parametrize("step", [1, 1 << 20], ids=["byte-by-byte", "whole"])
def test_response_frames_stream(name: str, kind: str, msg: Message, version: int, step: int) -> None:
    client = ClientConnection()
    datas = [sample(msg, version, seed=i) for i in range(2)]
    stream = b""
    for i, data in enumerate(datas):
        header = RequestHeader(msg.api_key, version, 7 + i, None, request_header_version(msg.api_key, version), 0)
        client.send_request(header, b"", context=i)
        stream += registry.joined(registry.encode_response(msg.api_key, version, 7 + i, data))
    events = []
    for i in range(0, len(stream), step):
        client.receive_data(stream[i:i + step])
        while (ev := client.next_event()) is not None:
            events.append(ev)
    assert [(e.correlation_id, e.context) for e in events] == [(7, 0), (8, 1)]
    for ev, data in zip(events, datas, strict=True):
        got = registry.decode_response(ev.api_key, ev.api_version, ev.frame, ev.body_offset)
        assert projected(got, data) == normalize(data)


def test_supported_table_covers_what_modern_clients_use() -> None:
    # Kafka 4.1 brokers: Fetch 4-18, ListOffsets 1-10, Metadata 0-13; librdkafka uses Fetch up to 16
    assert (registry.SUPPORTED[1].min_version, registry.SUPPORTED[1].max_version) == (4, 18)
    assert registry.SUPPORTED[2].max_version >= 9  # -5 LATEST_TIERED
    assert registry.SUPPORTED[10].max_version >= 4  # coordinators[]
    assert registry.supports(60, 0) and not registry.supports(60, 3)
