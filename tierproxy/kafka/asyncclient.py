"""A small asyncio Kafka client for the proxy's own control-plane requests (metadata refresh, offsets).

Not the relay path: that is `session.Session` on asyncio protocols.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from typing import Any

from protocol.client import RequestClient
from tierproxy.config.identity import ClientIdentity


class AsyncWireClient:
    """One connection; callers take turns (one exchange at a time), an exchange may carry several requests."""

    def __init__(self, host: str, port: int, *, client_id: str = "tierproxy", ssl_context: ssl.SSLContext | None = None,
                 timeout: float = 10.0, identity: ClientIdentity | None = None) -> None:
        """`identity` (tierproxy's `--command-config`) adds its TLS and SASL; otherwise `ssl_context` alone."""
        self.host, self.port = host, port
        self.client_id = identity.client_id or client_id if identity else client_id
        self.identity = identity
        self.ssl_context = identity.ssl_context() if identity is not None and identity.tls else ssl_context
        self.timeout = timeout
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._client = RequestClient(self.client_id)
        self._lock = asyncio.Lock()

    async def _connect(self) -> None:
        self._reader, self._writer = await asyncio.wait_for(
            asyncio.open_connection(self.host, self.port, ssl=self.ssl_context,
                                    server_hostname=self.host if self.ssl_context else None), self.timeout)
        if self.identity is not None and self.identity.sasl:
            try:
                await self._authenticate(self.identity)
            except BaseException:
                await self.close()
                raise

    async def _authenticate(self, identity: ClientIdentity) -> None:
        from tierproxy.config.identity.oauth import token_source
        from tierproxy.config.identity.sasl import conversation

        token = None
        if identity.oauth is not None:
            value = await token_source(identity.oauth).atoken()
            token = lambda: value  # noqa: E731 - fetched without blocking the loop, used at once
        talk = conversation(identity, token)
        try:
            req = next(talk)
            while True:
                req = talk.send(await self._exchange(*req))
        except StopIteration:
            pass

    async def request(self, api_key: int, version: int, body: dict[str, Any]) -> dict[str, Any]:
        return (await self.request_many([(api_key, version, body)]))[0]

    async def request_many(self, requests: list[tuple[int, int, dict[str, Any]]]) -> list[dict[str, Any]]:
        """Several requests written at once, their answers in order (Kafka answers a connection's requests in
        the order it received them, one at a time): no turnaround of ours between them."""
        async with self._lock:
            if self._writer is None:
                await self._connect()
            try:
                return await self._exchange_many(requests)
            except BaseException:
                # cancelled (a caller's timeout) or failed mid-exchange: the stream may still bring these
                # responses, which the next request would take for its own. Start that one on a new connection.
                self._drop()
                raise

    def _drop(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None
        self._client = RequestClient(self.client_id)

    async def _exchange(self, api_key: int, version: int, body: dict[str, Any]) -> dict[str, Any]:
        return (await self._exchange_many([(api_key, version, body)]))[0]

    async def _exchange_many(self, requests: list[tuple[int, int, dict[str, Any]]]) -> list[dict[str, Any]]:
        assert self._reader is not None and self._writer is not None
        for api_key, version, body in requests:
            self._writer.writelines(self._client.send(api_key, version, body))
        await self._writer.drain()
        answers: list[dict[str, Any]] = []
        while len(answers) < len(requests):
            ev = self._client.next_event()
            if ev is not None:
                answers.append(self._client.decode(ev))
                continue
            data = await asyncio.wait_for(self._reader.read(1 << 16), self.timeout)
            if not data:
                await self.close()
                raise ConnectionError(f"{self.host}:{self.port} closed the connection")
            self._client.receive_data(data)
        return answers

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(OSError):
                await self._writer.wait_closed()
        self._reader = self._writer = None
        self._client = RequestClient(self.client_id)
