"""A sans-IO request/response client: numbers, encodes and sends requests; matches and decodes their responses.

What the blocking `tierproxy.wireclient.WireClient` and the asyncio `tierproxy.asyncclient.AsyncWireClient`
share; they only move the bytes (the chunks `send` returns out, received bytes in).
"""

from __future__ import annotations

import itertools
from typing import Any

from protocol import registry
from protocol.connection import ClientConnection, ResponseEvent
from protocol.framing import DEFAULT_MAX_FRAME_SIZE
from protocol.headers import RequestHeader, request_header_version

Data = dict[str, Any]


class RequestClient:
    """One connection's requests, answered in order."""

    def __init__(self, client_id: str = "tierproxy", max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        self.client_id = client_id
        self.conn = ClientConnection(max_frame_size)
        self._ids = itertools.count(1)

    def send(self, api_key: int, version: int, body: Data) -> registry.Chunks:
        """Register a request and return its framed chunks to write (no joined copy)."""
        header = RequestHeader(api_key, version, next(self._ids), self.client_id,
                               request_header_version(api_key, version), 0)
        chunks = registry.encode_request(header, body)
        self.conn.expect_response(header)
        return chunks

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        self.conn.receive_data(data)

    def get_buffer(self, sizehint: int = -1) -> memoryview:
        return self.conn.get_buffer(sizehint)

    def buffer_updated(self, n: int) -> None:
        self.conn.buffer_updated(n)

    def next_response(self) -> ResponseEvent | None:
        """The next whole response, or None until more bytes arrive."""
        return self.conn.next_event()

    @staticmethod
    def decode(ev: ResponseEvent) -> Data:
        return registry.decode_response(ev.api_key, ev.api_version, ev.frame, ev.body_offset)
