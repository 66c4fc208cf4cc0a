"""Request and response headers.

Wire grammar:
    RequestHeader v0  => api_key:int16 api_version:int16 correlation_id:int32
    RequestHeader v1  => v0 client_id:nullable_string (int16 length, never compact)
    RequestHeader v2  => v1 tagged_fields
    ResponseHeader v0 => correlation_id:int32
    ResponseHeader v1 => v0 tagged_fields
A request uses header v2 when its API version is flexible, else v1. A response uses v1 when the request's
version is flexible, else v0 — except ApiVersions responses, which always use v0 (so a client can read the
error of an ApiVersions version the broker does not know).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from protocol.apis.keys import API_KEYS
from protocol.constants import ApiKey
from protocol.errors import ProtocolError
from protocol.primitives import Reader, Writer

# api_key:int16, api_version:int16, correlation_id:int32
REQUEST_HEADER_V0 = struct.Struct(">hhi")
# api_key:int16, api_version:int16, correlation_id:int32, client_id length:int16
REQUEST_HEADER_V1 = struct.Struct(">hhih")
# correlation_id:int32
RESPONSE_HEADER_V0 = struct.Struct(">i")


def request_header_version(api_key: int, api_version: int) -> int:
    """1 or 2; unknown API keys are read as v1 (their bodies stay opaque)."""
    flexible_from = API_KEYS.get(api_key, ("", None))[1]
    return 2 if flexible_from is not None and api_version >= flexible_from else 1


def response_header_version(api_key: int, api_version: int) -> int:
    if api_key == ApiKey.API_VERSIONS:
        return 0
    return 1 if request_header_version(api_key, api_version) == 2 else 0


@dataclass(slots=True)
class RequestHeader:
    """A decoded request header; `body_offset` is where the body starts in the frame."""

    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    header_version: int
    body_offset: int
    tagged: bytes = b""  # the raw tagged-field section of a v2 header (kept verbatim)

    def encode(self) -> bytes:
        w = Writer()
        w.raw(REQUEST_HEADER_V0.pack(self.api_key, self.api_version, self.correlation_id))
        w.string(self.client_id, compact=False)
        if self.header_version >= 2:
            w.raw(self.tagged or b"\x00")
        return bytes(w.buf)


def decode_request_header(frame: memoryview) -> RequestHeader:
    """Decode the header at the start of a request frame (without its size prefix)."""
    if len(frame) < REQUEST_HEADER_V1.size:
        if len(frame) < REQUEST_HEADER_V0.size:
            raise ProtocolError(f"request frame of {len(frame)} bytes is shorter than a header")
        return _decode_request_header(frame)
    api_key, api_version, correlation_id, n = REQUEST_HEADER_V1.unpack_from(frame, 0)
    version = request_header_version(api_key, api_version)
    end = REQUEST_HEADER_V1.size + n
    # the common shape, read in one go: a client id, and (v2) no tagged fields; anything else takes the Reader
    if n < 0 or end + (version >= 2) > len(frame) or (version >= 2 and frame[end] != 0):
        return _decode_request_header(frame)
    try:
        client_id = str(frame[REQUEST_HEADER_V1.size:end], "utf-8")
    except UnicodeDecodeError:
        return _decode_request_header(frame)
    if version >= 2:
        return RequestHeader(api_key, api_version, correlation_id, client_id, version, end + 1, b"\x00")
    return RequestHeader(api_key, api_version, correlation_id, client_id, version, end, b"")


def _decode_request_header(frame: memoryview) -> RequestHeader:
    api_key, api_version, correlation_id = REQUEST_HEADER_V0.unpack_from(frame, 0)
    version = request_header_version(api_key, api_version)
    r = Reader(frame, REQUEST_HEADER_V0.size)
    try:
        client_id = r.nullable_string()
        tagged = b""
        if version >= 2:
            start = r.pos
            _skip_tagged(r)
            tagged = bytes(frame[start:r.pos])
    except ProtocolError as exc:
        raise exc.with_context(api_key=api_key, api_version=api_version, field="header") from None
    return RequestHeader(api_key, api_version, correlation_id, client_id, version, r.pos, tagged)


def decode_response_header(frame: memoryview, header_version: int) -> tuple[int, int]:
    """(correlation_id, body_offset) of a response frame."""
    if len(frame) < 4:
        raise ProtocolError(f"response frame of {len(frame)} bytes has no correlation id")
    correlation_id = RESPONSE_HEADER_V0.unpack_from(frame, 0)[0]
    if header_version == 0:
        return correlation_id, 4
    r = Reader(frame, 4)
    _skip_tagged(r)
    return correlation_id, r.pos


def encode_response_header(correlation_id: int, header_version: int) -> bytes:
    head = RESPONSE_HEADER_V0.pack(correlation_id)
    return head + b"\x00" if header_version >= 1 else head


def _skip_tagged(r: Reader) -> None:
    for _ in range(r.unsigned_varint()):
        r.unsigned_varint()
        r.view(r.unsigned_varint())
