"""An in-process proxy core for tests: a real `Session` with the real handlers and codec, whose client and broker
are scripted (httpcore's mock-backend idea). No sockets, no broker, no sleeps."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Mapping
from typing import Any

from protocol import registry
from protocol.connection import ClientConnection, ServerConnection
from protocol.headers import RequestHeader, request_header_version
from tierproxy.config import ProxySettings
from tierproxy.proxy.brokers import BrokerMap
from tierproxy.proxy.flow import ByteBudget
from tierproxy.proxy.handlers import REQUEST_HANDLERS, RESPONSE_HANDLERS
from tierproxy.proxy.metrics import RemoteFetchStats
from tierproxy.proxy.session import ProxyContext, Session
from tierproxy.remote.view import RemoteTierView

Data = dict[str, Any]
ADVERTISED, PORT_BASE = "proxy.example", 9200


class RecordingTransport(asyncio.Transport):
    """One side of a connection: what the proxy wrote to it, and whether it closed it."""

    def __init__(self) -> None:
        super().__init__()
        self.written: list[bytes] = []
        self.closed = False
        self.reading = True  # the proxy's read gate: a scripted peer delivers bytes only while this holds

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def is_reading(self) -> bool:
        return self.reading

    def close(self) -> None:
        self.closed = True

    def take(self) -> bytes:
        out, self.written = b"".join(self.written), []
        return out


class InProcessProxy:
    """What a Session needs of its proxy: settings, the handler tables, the broker map, spawning tasks."""

    def __init__(self, remote: RemoteTierView | None = None, **settings: Any) -> None:
        self.settings = ProxySettings(bootstrap_servers="127.0.0.1:1", **settings)
        self.request_budget = ByteBudget(self.settings.queued_max_request_bytes, 64 * 1024)
        self.request_handlers = REQUEST_HANDLERS
        self.response_handlers = RESPONSE_HANDLERS
        self.new_nodes: list[int] = []
        self.brokers = BrokerMap(ADVERTISED, PORT_BASE, 100, self.new_nodes.append)
        self.remote = remote
        self.fetch_stats = RemoteFetchStats()
        self.tasks: list[asyncio.Task[Any]] = []
        self.closed_sessions: list[Session] = []

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return asyncio.get_running_loop()

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.append(task)
        return task

    async def connect_upstream(self, session: Session) -> tuple[asyncio.Transport, str]:
        raise ConnectionError("in process: the broker side is scripted (Wire sets the session's upstream)")

    def accepting(self, transport: asyncio.BaseTransport) -> bool:
        return True

    def session_opened(self, session: Session) -> None:
        return None

    def session_closed(self, session: Session) -> None:
        self.closed_sessions.append(session)
        self.request_budget.release(id(session))  # as the server does: what it held goes back

    async def settle(self) -> None:
        """Wait for every deferred response (delayed fetches) to finish."""
        while pending := [t for t in self.tasks if not t.done()]:
            await asyncio.wait(pending)


class Wire:
    """A session between a scripted client and a scripted broker (build it inside a running loop)."""

    def __init__(self, proxy: InProcessProxy | None = None) -> None:
        self.proxy = proxy or InProcessProxy()
        context: ProxyContext = self.proxy  # checked: the in-process proxy is what a session may use
        self.session = Session(context, None)
        self.client, self.broker = RecordingTransport(), RecordingTransport()
        self.session.client = self.client
        self.session.upstream = self.broker
        self.session.upstream_name = "broker.example:9092"
        self._client_conn = ClientConnection()  # the client's view of its own connection
        self._broker_conn = ServerConnection()  # the broker's view
        self._ids = iter(range(1, 1 << 30))

    def client_sends(self, api_key: int, version: int, body: Mapping[str, Any]) -> RequestHeader:
        header = RequestHeader(api_key, version, next(self._ids), "scripted", request_header_version(api_key, version),
                               0)
        self._client_conn.expect_response(header)
        self.session.server.receive_data(b"".join(bytes(c) for c in registry.encode_request(header, body)))
        self.session.process_client()
        return header

    def client_sends_raw(self, header: RequestHeader, frame: bytes) -> None:
        """A request whose body the codec does not know (an opaque API)."""
        self._client_conn.expect_response(header)
        self.session.server.receive_data(frame)
        self.session.process_client()

    def broker_receives(self) -> list[tuple[RequestHeader, bytes]]:
        """Each request frame the broker got: its header and the whole frame (without size prefix)."""
        self._broker_conn.receive_data(self.broker.take())
        out = []
        while (ev := self._broker_conn.next_event()) is not None:
            out.append((ev.header, bytes(ev.frame)))
        return out

    def broker_answers(self, header: RequestHeader, body: Mapping[str, Any] | bytes) -> None:
        """The broker's response to `header`: a body to encode, or the whole frame (size prefix included)."""
        raw = body if isinstance(body, bytes) else registry.joined(registry.encode_response(
            header.api_key, header.api_version, header.correlation_id, body))
        self.session.upstream_conn.receive_data(raw)
        self.session.process_upstream()

    def client_receives(self) -> list[tuple[int, bytes, Data | None]]:
        """(correlation id, whole frame, decoded body or None for an opaque API) of each response written."""
        self._client_conn.receive_data(self.client.take())
        out = []
        while (ev := self._client_conn.next_event()) is not None:
            body = (registry.decode_response(ev.api_key, ev.api_version, ev.frame, ev.body_offset)
                    if registry.supports(ev.api_key, ev.api_version) else None)
            out.append((ev.correlation_id, bytes(ev.frame), body))
        return out


def run(coro: Any) -> Any:
    return asyncio.run(coro)
