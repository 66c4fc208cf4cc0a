"""Hypothesis: arbitrary and mutated frames either decode or raise ProtocolError — never anything else.

CI runs a few hundred cases per property; set TIERPROXY_FUZZ_EXAMPLES=100000 for the on-demand run.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol import registry
from protocol.connection import ClientConnection, ServerConnection
from protocol.errors import ProtocolError
from protocol.headers import RequestHeader, request_header_version
from protocol.records import build_batch, iter_batches
from protocol.schema import Message
from tests.support.samples import records_of, sample

EXAMPLES = int(os.environ.get("TIERPROXY_FUZZ_EXAMPLES", "300"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])

MESSAGES: list[tuple[Message, int]] = [
    (msg, v) for msg in {id(m): m for s in (*registry.SUPPORTED.values(), *registry.OWN.values())
                         for m in (s.request, s.response) if m is not None}.values()
    for v in range(msg.min_version, msg.max_version + 1)]
VALID = {(m.name, v): m.encode(sample(m, v, seed=3), v) for m, v in MESSAGES}

mutation = st.tuples(st.sampled_from(["flip", "insert", "delete", "truncate", "set"]),
                     st.integers(0, 1 << 16), st.integers(0, 255))


def _mutate(data: bytes, ops: list[tuple[str, int, int]]) -> bytes:
    buf = bytearray(data)
    for op, pos, byte in ops:
        i = pos % (len(buf) + 1)
        if op == "flip" and buf:
            buf[i % len(buf)] ^= 1 << (byte % 8)
        elif op == "set" and buf:
            buf[i % len(buf)] = byte
        elif op == "insert":
            buf.insert(i, byte)
        elif op == "delete" and buf:
            del buf[i % len(buf)]
        elif op == "truncate":
            del buf[i:]
    return bytes(buf)


def _decode_or_protocol_error(msg: Message, version: int, data: bytes) -> None:
    try:
        decoded = msg.decode(memoryview(data), version)
    except ProtocolError:
        return
    assert msg.encode(decoded, version) is not None  # whatever decodes also encodes


@FUZZ
@given(st.sampled_from(MESSAGES), st.binary(max_size=512))
def test_arbitrary_bytes(case: tuple[Message, int], data: bytes) -> None:
    _decode_or_protocol_error(case[0], case[1], data)


@FUZZ
@given(st.sampled_from(MESSAGES), st.lists(mutation, min_size=1, max_size=6))
def test_mutated_valid_messages(case: tuple[Message, int], ops: list[tuple[str, int, int]]) -> None:
    msg, version = case
    _decode_or_protocol_error(msg, version, _mutate(VALID[(msg.name, version)], ops))


@FUZZ
@given(st.binary(max_size=2048), st.integers(1, 64))
def test_arbitrary_request_streams(data: bytes, step: int) -> None:
    conn = ServerConnection(max_frame_size=4096)
    try:
        for i in range(0, len(data), step):
            conn.receive_data(data[i:i + step])
            while (ev := conn.next_event()) is not None:
                if registry.supports(ev.header.api_key, ev.header.api_version) and \
                        registry.SUPPORTED[ev.header.api_key].request is not None:
                    registry.decode_request(ev.header, ev.frame)
    except ProtocolError:
        pass


@FUZZ
@given(st.sampled_from([m for m in MESSAGES if m[0].name.endswith("Response") and any(
    m[0] is s.response for s in registry.SUPPORTED.values())]),
       st.lists(mutation, min_size=1, max_size=4))
def test_mutated_response_frames(case: tuple[Message, int], ops: list[tuple[str, int, int]]) -> None:
    msg, version = case
    client = ClientConnection(max_frame_size=1 << 20)
    header = RequestHeader(msg.api_key, version, 5, None, request_header_version(msg.api_key, version), 0)
    client.send_request(header, b"")
    frame = registry.joined(registry.encode_response(msg.api_key, version, 5, sample(msg, version)))
    try:
        client.receive_data(_mutate(frame, ops))
        ev = client.next_event()
        if ev is not None:
            registry.decode_response(ev.api_key, ev.api_version, ev.frame, ev.body_offset)
    except ProtocolError:
        pass


BATCHES = build_batch(records_of(10)) + build_batch(records_of(4, base=10), base_offset=10, codec=2)


@FUZZ
@given(st.lists(mutation, min_size=1, max_size=6))
def test_mutated_record_batches(ops: list[tuple[str, int, int]]) -> None:
    data = _mutate(BATCHES, ops)
    try:
        for batch in iter_batches(data):
            batch.crc_ok()
            if batch.magic == 2:
                list(batch.records())
    except ProtocolError:
        pass
