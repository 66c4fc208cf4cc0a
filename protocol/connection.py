"""Sans-IO Kafka connections in the style of h11's `Connection`: bytes in, events out.

`ServerConnection` is the side that receives requests (the proxy facing a client); `ClientConnection` the side
that sends requests and receives responses (the proxy facing a broker). Neither does any IO: the caller feeds
received bytes (or lets the transport write into `get_buffer`) and writes the chunks it is handed.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

from protocol.apis.produce import produce_acks
from protocol.constants import ApiKey
from protocol.errors import ProtocolError
from protocol.framing import DEFAULT_MAX_FRAME_SIZE, HEAD, FrameBuffer, frame_header
from protocol.headers import (
    RequestHeader,
    decode_request_header,
    decode_response_header,
    response_header_version,
)


@dataclass(slots=True)
class RequestEvent:
    """A whole request frame; `frame` excludes the size prefix, the body starts at `header.body_offset`; `wire`
    is the frame as received, size prefix included (None when the event was not received from a peer)."""

    header: RequestHeader
    frame: memoryview
    expects_response: bool
    wire: memoryview | None = None

    @property
    def body(self) -> memoryview:
        return self.frame[self.header.body_offset:]


@dataclass(slots=True)
class ResponseEvent:
    """A whole response frame matched to its request (`context` is what the sender attached); `wire` is the
    frame as received, size prefix included (None when the event was not received from a peer)."""

    correlation_id: int
    api_key: int
    api_version: int
    frame: memoryview
    body_offset: int
    context: Any = None
    wire: memoryview | None = None


class _Receiving:
    """Bytes in: copied (`receive_data`) or received in place (`get_buffer`, then `buffer_updated`, the shape of
    asyncio's BufferedProtocol and of `socket.recv_into`)."""

    def __init__(self, max_frame_size: int, trusted_sizes: bool = True) -> None:
        self.frames = FrameBuffer(max_frame_size, trusted_sizes=trusted_sizes)

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        self.frames.feed(data)

    def get_buffer(self, sizehint: int = -1) -> memoryview:
        """Where the next received bytes go; report how many with `buffer_updated`."""
        return self.frames.get_buffer(sizehint)

    def buffer_updated(self, n: int) -> None:
        self.frames.buffer_updated(n)

    def buffered(self) -> int:
        """Bytes received and not yet returned as an event."""
        return self.frames.buffered()


class ServerConnection(_Receiving):
    """Receives request frames; answers whether each expects a response (acks=0 Produce does not). A client's
    announced request size is not trusted: memory grows with the bytes it actually sends."""

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        super().__init__(max_frame_size, trusted_sizes=False)

    def next_event(self) -> RequestEvent | None:
        wire = self.frames.next_wire()
        if wire is None:
            return None
        frame = wire[HEAD:]
        header = decode_request_header(frame)
        expects = True
        if header.api_key == ApiKey.PRODUCE:
            expects = produce_acks(frame, header.api_version, header.body_offset) != 0
        return RequestEvent(header, frame, expects, wire)


@dataclass(slots=True)
class _InFlight:
    correlation_id: int
    api_key: int
    api_version: int
    context: Any


class ClientConnection(_Receiving):
    """Sends requests, receives their responses in order (Kafka answers a connection's requests in order)."""

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        super().__init__(max_frame_size)
        self._in_flight: deque[_InFlight] = deque()

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    def expect_response(self, header: RequestHeader, context: Any = None) -> None:
        """Register a request the caller writes itself; its response will carry `context`."""
        self._in_flight.append(_InFlight(header.correlation_id, header.api_key, header.api_version, context))

    def send_request(self, header: RequestHeader, frame: memoryview | bytes, *, expects_response: bool = True,
                     context: Any = None) -> list[bytes | memoryview]:
        """Register a request (its whole frame without size prefix) and return the chunks to write."""
        if expects_response:
            self.expect_response(header, context)
        return [frame_header(len(frame)), frame]

    def next_event(self) -> ResponseEvent | None:
        if not self._in_flight:
            if self.frames.buffered():
                raise ProtocolError(f"{self.frames.buffered()} bytes received with no request in flight")
            return None
        wire = self.frames.next_wire()
        if wire is None:
            return None
        frame = wire[HEAD:]
        pending = self._in_flight.popleft()
        correlation_id, offset = decode_response_header(
            frame, response_header_version(pending.api_key, pending.api_version))
        if correlation_id != pending.correlation_id:
            raise ProtocolError(f"response correlation id {correlation_id} does not match the request in flight "
                                f"({pending.correlation_id})", api_key=pending.api_key)
        return ResponseEvent(correlation_id, pending.api_key, pending.api_version, frame, offset, pending.context, wire)
