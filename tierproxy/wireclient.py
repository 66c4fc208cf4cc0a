"""A small blocking Kafka client over one socket, speaking the `protocol` package.

For tools, the tiering job's executors (raw record batches, never re-encoded) and tests. Not for the proxy's
hot path, which is asyncio.
"""

from __future__ import annotations

import itertools
import socket
from typing import Any

from protocol import registry
from protocol.connection import ClientConnection, ResponseEvent
from protocol.headers import RequestHeader, request_header_version


class WireClient:
    """One connection to one broker; `request` sends a decoded-API request and returns the decoded response."""

    def __init__(self, bootstrap: str, client_id: str = "tierproxy", timeout: float = 30.0) -> None:
        host, _, port = bootstrap.split(",")[0].rpartition(":")
        self.address = (host, int(port))
        self.client_id = client_id
        self.sock = socket.create_connection(self.address, timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.conn = ClientConnection()
        self._ids = itertools.count(1)

    def request_event(self, api_key: int, version: int, body: dict[str, Any]) -> ResponseEvent:
        header = RequestHeader(api_key, version, next(self._ids), self.client_id,
                               request_header_version(api_key, version), 0)
        chunks = registry.encode_request(header, body)
        frame = b"".join(bytes(c) for c in chunks[1:])
        for chunk in self.conn.send_request(header, frame):
            self.sock.sendall(chunk)
        while True:
            ev = self.conn.next_event()
            if ev is not None:
                return ev
            region = self.conn.frames.get_buffer()
            n = self.sock.recv_into(region)
            del region
            if n == 0:
                raise ConnectionError(f"{self.address} closed the connection")
            self.conn.frames.buffer_updated(n)

    def request(self, api_key: int, version: int, body: dict[str, Any]) -> dict[str, Any]:
        ev = self.request_event(api_key, version, body)
        return registry.decode_response(api_key, version, ev.frame, ev.body_offset)

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> WireClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
