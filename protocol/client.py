"""A sans-IO request/response client: numbers, encodes and sends requests; matches and decodes their responses.

What the blocking `tierproxy.kafka.wireclient.WireClient` and the asyncio `tierproxy.kafka.asyncclient.AsyncWireClient`
share; they only move the bytes (the chunks `send` returns out, received bytes in).
"""

from __future__ import annotations

import itertools
from typing import Any

from protocol import registry
from protocol.connection import ClientConnection, ResponseEvent
from protocol.framing import DEFAULT_MAX_FRAME_SIZE
from protocol.headers import RequestHeader, request_header_version
from protocol.primitives import Buffer

Data = dict[str, Any]


class RequestClient(ClientConnection):
    """One connection's own requests, answered in order (bytes in as a `ClientConnection` takes them)."""

    def __init__(self, client_id: str = "tierproxy", max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        super().__init__(max_frame_size)
        self.client_id = client_id
        self._ids = itertools.count(1)

    def send(self, api_key: int, version: int, body: Data) -> list[Buffer]:
        """Register a request and return its framed chunks to write (no joined copy)."""
        header = RequestHeader(api_key, version, next(self._ids), self.client_id,
                               request_header_version(api_key, version), 0)
        chunks = registry.encode_request(header, body)
        self.expect_response(header)
        return chunks

    @staticmethod
    def decode(ev: ResponseEvent) -> Data:
        return registry.decode_response(ev.api_key, ev.api_version, ev.frame, ev.body_offset)
