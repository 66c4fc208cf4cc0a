"""A small asyncio Kafka client for the proxy's own control-plane requests (metadata refresh, offsets).

Not the relay path: that is `session.Session` on asyncio protocols.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import ssl
from typing import Any

from protocol import registry
from protocol.connection import ClientConnection
from protocol.headers import RequestHeader, request_header_version


class AsyncWireClient:
    """One connection; requests are serialized (one in flight), which is all the control plane needs."""

    def __init__(self, host: str, port: int, *, client_id: str = "tierproxy", ssl_context: ssl.SSLContext | None = None,
                 timeout: float = 10.0) -> None:
        self.host, self.port = host, port
        self.client_id = client_id
        self.ssl_context = ssl_context
        self.timeout = timeout
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._conn = ClientConnection()
        self._ids = itertools.count(1)
        self._lock = asyncio.Lock()

    async def _connect(self) -> None:
        self._reader, self._writer = await asyncio.wait_for(
            asyncio.open_connection(self.host, self.port, ssl=self.ssl_context,
                                    server_hostname=self.host if self.ssl_context else None), self.timeout)

    async def request(self, api_key: int, version: int, body: dict[str, Any]) -> dict[str, Any]:
        async with self._lock:
            if self._writer is None:
                await self._connect()
            assert self._reader is not None and self._writer is not None
            header = RequestHeader(api_key, version, next(self._ids), self.client_id,
                                   request_header_version(api_key, version), 0)
            chunks = registry.encode_request(header, body)
            frame = b"".join(bytes(c) for c in chunks[1:])
            for chunk in self._conn.send_request(header, frame):
                self._writer.write(chunk)
            await self._writer.drain()
            while True:
                ev = self._conn.next_event()
                if ev is not None:
                    return registry.decode_response(api_key, version, ev.frame, ev.body_offset)
                data = await asyncio.wait_for(self._reader.read(1 << 16), self.timeout)
                if not data:
                    await self.close()
                    raise ConnectionError(f"{self.host}:{self.port} closed the connection")
                self._conn.receive_data(data)

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(OSError):
                await self._writer.wait_closed()
        self._reader = self._writer = None
        self._conn = ClientConnection()
