"""Framing and primitive types: tables, limits, and the purity of the protocol package."""

from __future__ import annotations

import ast
import contextlib
import struct
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.errors import ProtocolError
from protocol.framing import FrameBuffer, frame_header
from protocol.headers import (
    _decode_request_header,
    decode_request_header,
    decode_response_header,
    request_header_version,
)
from protocol.primitives import Reader, Writer, encode_unsigned_varint, encode_varint

VARINTS = [(0, b"\x00"), (1, b"\x02"), (-1, b"\x01"), (63, b"\x7e"), (-64, b"\x7f"), (64, b"\x80\x01"),
           (2147483647, b"\xfe\xff\xff\xff\x0f"), (-2147483648, b"\xff\xff\xff\xff\x0f")]
UVARINTS = [(0, b"\x00"), (127, b"\x7f"), (128, b"\x80\x01"), (300, b"\xac\x02"), (16383, b"\xff\x7f"),
            (16384, b"\x80\x80\x01")]


@pytest.mark.parametrize(("value", "wire"), VARINTS)
def test_varint_table(value: int, wire: bytes) -> None:
    assert encode_varint(value) == wire
    r = Reader(memoryview(wire))
    assert r.varint() == value and r.remaining() == 0


@pytest.mark.parametrize(("value", "wire"), UVARINTS)
def test_unsigned_varint_table(value: int, wire: bytes) -> None:
    assert encode_unsigned_varint(value) == wire
    assert Reader(memoryview(wire)).unsigned_varint() == value


def test_varlong_extremes_round_trip() -> None:
    for v in (-(1 << 63), (1 << 63) - 1, 0, -1, 1 << 40):
        w = Writer()
        w.varlong(v)
        assert Reader(memoryview(bytes(w.buf))).varlong() == v


@pytest.mark.parametrize(("wire", "compact", "value"), [
    (b"\xff\xff", False, None), (b"\x00\x03abc", False, "abc"), (b"\x00", True, None), (b"\x04abc", True, "abc"),
    (b"\x01", True, ""), (b"\x00\x00", False, ""),
])
def test_nullable_strings(wire: bytes, compact: bool, value: str | None) -> None:
    r = Reader(memoryview(wire))
    assert (r.compact_nullable_string() if compact else r.nullable_string()) == value
    w = Writer()
    w.string(value, compact)
    assert bytes(w.buf) == wire


@pytest.mark.parametrize("wire", [b"\x00\x05ab", b"\xff\xfe", b"\x80", b"\x80\x80\x80\x80\x80\x80\x80\x80\x80\x80\x01",
                                  b"\x00\x02\xff\xfe"])
def test_malformed_primitives_raise_protocol_error(wire: bytes) -> None:
    with pytest.raises(ProtocolError):
        r = Reader(memoryview(wire))
        if wire[:1] in (b"\x80",):
            r.unsigned_varint()
        else:
            r.nullable_string()


def test_bytes_are_views_not_copies() -> None:
    frame = bytearray(b"\x00\x00\x00\x03xyz")
    view = Reader(memoryview(frame)).bytes_view()
    assert view.obj is frame
    frame[4] = ord("Q")
    assert bytes(view) == b"Qyz"


def test_oversized_frame_rejected_before_buffering() -> None:
    fb = FrameBuffer(max_frame_size=1024)
    fb.feed(frame_header(1025))
    with pytest.raises(ProtocolError, match="max frame size"):
        fb.next_frame()
    fb2 = FrameBuffer()
    fb2.feed(struct.pack(">i", -5))
    with pytest.raises(ProtocolError):
        fb2.next_frame()


def test_large_frame_lands_in_its_own_buffer_without_staging_it() -> None:
    payload = bytes(range(256)) * 4096  # 1 MiB
    fb = FrameBuffer(staging_size=64 * 1024)
    fb.feed(frame_header(len(payload)) + payload[:100])
    assert fb.next_frame() is None
    region = fb.get_buffer()
    assert len(region) == len(payload) - 100  # the rest is received straight into the frame's buffer
    region[:] = payload[100:]
    del region
    fb.buffer_updated(len(payload) - 100)
    frame = fb.next_frame()
    assert frame is not None and bytes(frame) == payload and isinstance(frame.obj, bytearray)


def test_an_untrusted_size_claim_does_not_allocate_the_claimed_bytes() -> None:
    claimed = 90 << 20
    fb = FrameBuffer(trusted_sizes=False)
    sent = bytes(range(256)) * 4096  # 1 MiB of the 90 MiB announced
    fb.feed(frame_header(claimed) + sent)
    assert fb.next_frame() is None and fb.buffered() == len(sent)
    assert fb.allocated() <= 2 * len(sent) + 64 * 1024  # grows with what arrives (doubling), not what is claimed
    assert FrameBuffer(trusted_sizes=True).allocated() < claimed


@pytest.mark.parametrize("size", [40_000, 100_000, 1_000_003])
@pytest.mark.parametrize("step", [1, 4093, 65536, 1 << 20])
def test_a_growing_frame_buffer_hands_out_exactly_the_frame(size: int, step: int) -> None:
    payload = bytes(i % 251 for i in range(size))
    wire = frame_header(size) + payload + frame_header(3) + b"abc"
    frames = received(FrameBuffer(trusted_sizes=False), wire, step if size < 1_000_000 or step > 1 else 65536,
                      FrameBuffer.next_frame)
    assert frames == [payload, b"abc"]


def received(fb: FrameBuffer, wire: bytes, step: int, take: Callable[[FrameBuffer], memoryview | None]
             ) -> list[bytes]:
    """`wire` arriving `step` bytes at a time as a BufferedProtocol receives it (into `get_buffer`, whatever length
    it offers), and each frame `take` hands out after every read."""
    out: list[bytes] = []
    for i in range(0, len(wire), step):
        chunk = wire[i:i + step]
        while chunk:
            budgeted, growth = fb.budgeted(), fb.growth()
            region = fb.get_buffer()
            # what get_buffer allocates beyond the staging buffer is told beforehand (a memory bound reserves it)
            assert fb.budgeted() - budgeted == growth
            n = min(len(region), len(chunk))
            region[:n] = chunk[:n]
            del region
            fb.buffer_updated(n)
            chunk = chunk[n:]
            while (frame := take(fb)) is not None:
                out.append(bytes(frame))
    return out


def test_a_view_still_held_by_the_caller_does_not_break_growth() -> None:
    fb = FrameBuffer(trusted_sizes=False)
    payload = bytes(300_000)
    fb.feed(frame_header(len(payload)) + payload[:70_000])
    held = fb.get_buffer()  # a caller that keeps its region past buffer_updated
    held[:10] = payload[70_000:70_010]
    fb.buffer_updated(10)
    fb.feed(payload[70_010:])
    frame = fb.next_frame()
    assert frame is not None and bytes(frame) == payload
    del held


def test_request_header_versions() -> None:
    assert request_header_version(1, 11) == 1 and request_header_version(1, 12) == 2
    assert request_header_version(18, 3) == 2 and request_header_version(9999, 5) == 1
    frame = memoryview(struct.pack(">hhih", 1, 12, 42, 3) + b"cid" + b"\x01\x05\x02ab" + b"BODY")
    h = decode_request_header(frame)
    assert (h.api_key, h.api_version, h.correlation_id, h.client_id) == (1, 12, 42, "cid")
    assert h.tagged == b"\x01\x05\x02ab" and bytes(frame[h.body_offset:]) == b"BODY"
    assert h.encode() == bytes(frame[:h.body_offset])
    assert decode_response_header(memoryview(b"\x00\x00\x00\x07\x00rest"), 1) == (7, 5)
    with pytest.raises(ProtocolError):
        decode_request_header(memoryview(b"\x00\x01\x00"))


FORBIDDEN = {"asyncio", "socket", "threading", "selectors", "ssl", "aiobotocore", "botocore", "boto3",
             "multiprocessing", "concurrent", "aiokafka", "tierproxy", "subprocess", "http", "urllib"}


def test_protocol_package_is_sans_io() -> None:
    root = Path(__file__).resolve().parents[2] / "protocol"
    offenders = []
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] in FORBIDDEN]
    assert offenders == []


@pytest.mark.parametrize("trusted", [True, False])
@pytest.mark.parametrize("step", [1, 3, 4093, 65536, 70_000])
def test_next_wire_hands_out_each_frame_exactly_as_it_came(trusted: bool, step: int) -> None:
    """Size prefix included, small frames (staged, across compactions) and large ones (their own buffer) alike:
    what a relay writes back out in one piece is byte for byte what arrived."""
    sizes = [0, 5, 20_000, 40_000, 33_000, 150_000, 7, 65_536]
    wire = b"".join(frame_header(n) + bytes((n + i) % 251 for i in range(n)) for n in sizes)
    got = received(FrameBuffer(trusted_sizes=trusted), wire, step, FrameBuffer.next_wire)
    assert b"".join(got) == wire
    assert [len(g) - 4 for g in got] == sizes


@settings(max_examples=500, deadline=None)
@given(st.one_of(
    st.binary(max_size=40),
    st.builds(lambda key, ver, cid, client, tail: bytes.fromhex(f"{key:04x}{ver:04x}{cid:08x}") +
              (len(client).to_bytes(2, "big") + client if client is not None else b"\xff\xff") + tail,
              st.sampled_from([0, 1, 3, 18, 60, 999]), st.integers(0, 20), st.integers(0, 2**31 - 1),
              st.one_of(st.none(), st.binary(max_size=12), st.text(max_size=8).map(str.encode)),
              st.binary(max_size=12))))
def test_the_request_header_fast_path_agrees_with_the_reader(frame: bytes) -> None:
    """The one-struct read of the common header shape decodes exactly what the field-by-field read does, and
    raises ProtocolError exactly where it does."""
    slow = None
    if len(frame) >= 8:
        with contextlib.suppress(ProtocolError):
            slow = _decode_request_header(memoryview(frame))
    try:
        fast = decode_request_header(memoryview(frame))
    except ProtocolError:
        fast = None
    assert fast == slow


def test_the_staging_buffer_starts_small_and_grows_to_its_full_size_while_reads_fill_it() -> None:
    """An idle connection holds 4 KiB; a peer that sends more than the buffer holds gets it doubled at each read
    that fills it, up to the full 64 KiB, with every frame handed out whole; which frames get a buffer of their own
    (over 32 KiB) does not change with the buffer's size."""
    fb = FrameBuffer()
    assert fb.allocated() == 4096
    frame = frame_header(124) + bytes(range(124))  # 128 bytes: whole frames fill a region exactly
    offered, frames = [], 0
    for _ in range(8):
        region = fb.get_buffer()
        offered.append(len(region))
        region[:] = frame * (len(region) // len(frame))
        fb.buffer_updated(len(region))
        del region
        while (got := fb.next_frame()) is not None:
            assert bytes(got) == frame[4:]
            frames += 1
    assert offered == [4096, 8192, 16384, 32768, 65536, 65536, 65536, 65536]
    assert frames == sum(offered) // len(frame)
    staged = FrameBuffer()  # a 20 KiB frame is staged (the buffer grows to hold it), a 40 KiB one is not
    assert received(staged, frame_header(20_000) + bytes(20_000), 4096, FrameBuffer.next_frame) == [bytes(20_000)]
    assert staged.allocated() == 32768
    big = FrameBuffer()
    big.feed(frame_header(40_000) + bytes(100))
    assert big.next_frame() is None and big.allocated() == 4096 + 4 + 40_000
