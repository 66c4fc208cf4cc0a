"""A small blocking Kafka client over one socket, speaking the `protocol` package.

For tools, the tiering job's executors (raw record batches, never re-encoded) and tests. Not for the proxy's
hot path, which is asyncio.
"""

from __future__ import annotations

import socket
from typing import Any

from protocol.client import RequestClient
from protocol.connection import ResponseEvent
from tierproxy.config.identity import ClientIdentity


class WireClient:
    """One connection to one broker; `request` sends a decoded-API request and returns the decoded response."""

    def __init__(self, bootstrap: str, client_id: str = "tierproxy", timeout: float = 30.0,
                 identity: ClientIdentity | None = None) -> None:
        """Connect, with TLS and SASL when `identity` asks for them (tierproxy's `--command-config`)."""
        self.client = RequestClient(identity.client_id or client_id if identity else client_id)
        sock, host = self._connect(bootstrap, timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            ctx = identity.ssl_context() if identity is not None else None
            self.sock = ctx.wrap_socket(sock, server_hostname=host) if ctx is not None else sock
            if identity is not None and identity.sasl:
                self._authenticate(identity)
        except BaseException:
            getattr(self, "sock", sock).close()  # the TLS socket once it wraps (it took the descriptor over)
            raise

    def _connect(self, bootstrap: str, timeout: float) -> tuple[socket.socket, str]:
        """The first address of a `bootstrap` list that accepts a connection, as Kafka clients bootstrap: a dead
        first broker must not stop tools and the tiering driver."""
        error: OSError | None = None
        for address in (a.strip() for a in bootstrap.split(",") if a.strip()):
            host, _, port = address.rpartition(":")
            self.address = (host, int(port))
            try:
                return socket.create_connection(self.address, timeout=timeout), host
            except OSError as exc:
                error = exc
        raise error or OSError(f"no broker address in {bootstrap!r}")

    def _authenticate(self, identity: ClientIdentity) -> None:
        from tierproxy.config.identity.clients import token_getter
        from tierproxy.config.identity.sasl import conversation

        talk = conversation(identity, token_getter(identity))
        try:
            req = next(talk)
            while True:
                req = talk.send(self.request(*req))
        except StopIteration:
            pass

    def request_event(self, api_key: int, version: int, body: dict[str, Any]) -> ResponseEvent:
        """Send one request and return its response frame undecoded (record sets stay views of it)."""
        for chunk in self.client.send(api_key, version, body):
            self.sock.sendall(chunk)
        while True:
            ev = self.client.next_event()
            if ev is not None:
                return ev
            region = self.client.get_buffer()
            n = self.sock.recv_into(region)
            del region
            if n == 0:
                raise ConnectionError(f"{self.address} closed the connection")
            self.client.buffer_updated(n)

    def request(self, api_key: int, version: int, body: dict[str, Any]) -> dict[str, Any]:
        return self.client.decode(self.request_event(api_key, version, body))

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> WireClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
