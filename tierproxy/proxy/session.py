"""One client connection and its own upstream broker connection (1:1, so SASL identity and ACLs apply).

The transport is thin: both sides are asyncio BufferedProtocols that receive straight into the sans-IO frame
buffers of `protocol.connection`; the session loops over whole frames until more bytes are needed. Responses go
back in request order through a queue of slots — most are filled the moment the broker answers (opaque
frames are written untouched), intercepted ones may be filled later (remote reads) or locally.
Backpressure: a slow client pauses reading from the broker, a slow broker pauses reading from the client, and
too many requests in flight pause the client too.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Protocol, cast

from protocol.connection import ClientConnection, RequestEvent, ResponseEvent, ServerConnection
from protocol.errors import ProtocolError
from protocol.framing import frame_header
from protocol.headers import RequestHeader
from protocol.primitives import Buffer, Chunk, FileRegion
from tierproxy.config import ProxySettings
from tierproxy.proxy.brokers import BrokerMap
from tierproxy.proxy.flow import ByteBudget, ReadGate
from tierproxy.proxy.metrics import RemoteFetchStats
from tierproxy.proxy.sendfile import FileSender, can_send_files
from tierproxy.remote.view import RemoteTierView

log = logging.getLogger("tierproxy.proxy.session")
Chunks = Sequence[Chunk]  # buffers, and file regions (`FileRegion`) that `flush` sends with sendfile
SMALL_FRAME = 64 * 1024  # below this a size prefix and frame go out as one write


class Slot:
    """A response position in the client's stream; `chunks` is None until the response is ready."""

    __slots__ = ("chunks", "ctx", "header", "on_drop")

    def __init__(self, header: RequestHeader, chunks: Chunks | None = None, ctx: Any = None,
                 on_drop: Callable[[], None] | None = None) -> None:
        self.header = header
        self.chunks = chunks
        self.ctx = ctx  # what a handler remembers of the request for its response
        self.on_drop = on_drop  # called if the connection closes before the response is written (frees what it holds)


def framed(frame: memoryview | bytes) -> list[Buffer]:
    """A frame with its size prefix, as few chunks as possible without copying large payloads."""
    if len(frame) < SMALL_FRAME:
        return [frame_header(len(frame)) + bytes(frame)]
    return [frame_header(len(frame)), frame]


def as_received(ev: RequestEvent | ResponseEvent) -> list[Buffer]:
    """A frame relayed unchanged: the bytes as they arrived, size prefix included, in one write and no copy."""
    return [ev.wire] if ev.wire is not None else framed(ev.frame)


RequestHandler = Callable[["Session", RequestEvent], None]
ResponseHandler = Callable[["Session", Slot, ResponseEvent], None]


class ProxyContext(Protocol):
    """What a session, the handlers and the intercepts may use of the proxy: the server implements it, and so
    does the in-process proxy of `tests/core`. (Named here, below the server: no import of it, no cycle.)"""

    settings: ProxySettings
    brokers: BrokerMap  # node ids and the proxy's advertised ports
    fetch_stats: RemoteFetchStats
    request_budget: ByteBudget  # queued.max.request.bytes, shared by requests received and responses assembled
    request_handlers: dict[int, RequestHandler]
    response_handlers: dict[int, ResponseHandler]

    @property
    def remote(self) -> RemoteTierView | None:
        """The remote tier (None: a pure pass-through proxy)."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]: ...

    async def connect_upstream(self, session: Session) -> tuple[asyncio.Transport, str]: ...

    def accepting(self, transport: asyncio.BaseTransport) -> bool: ...

    def session_opened(self, session: Session) -> None: ...

    def session_closed(self, session: Session) -> None: ...


class Session:
    """Relays one client connection to one broker connection."""

    def __init__(self, proxy: ProxyContext, node_id: int | None) -> None:
        self.proxy = proxy
        self.node_id = node_id  # None: the bootstrap listener (any broker)
        settings = proxy.settings
        self.server = ServerConnection(settings.socket_request_max_bytes)
        self.upstream_conn = ClientConnection(settings.socket_request_max_bytes)
        self.client: asyncio.Transport | None = None
        self.upstream: asyncio.Transport | None = None
        self.client_gate = ReadGate()
        self.upstream_gate = ReadGate()
        self.slots: deque[Slot] = deque()
        self.max_in_flight = settings.max_in_flight_requests
        self.closed = False
        self.peer = "?"
        self.upstream_name = "?"
        self.last_active = asyncio.get_running_loop().time()
        # partitions this connection reads from the tier → the broker's local log start (fetches below it are
        # read early); keyed (topic name or id, partition) as the Fetch names them
        self.tiered: dict[tuple[str | bytes, int], int] = {}
        self.first_fetch = True  # its first Fetch is decoded: a cold catch-up's partitions are read from its arrival
        # topic (name or id, as the Fetch names it) → time.monotonic() of a request whose fetch of it the broker
        # authorized (answered OFFSET_OUT_OF_RANGE): within remote.authorization.cache.ms of it, fetches the tier
        # answers whole are not asked of the broker again
        self.authorized: dict[str | bytes, float] = {}
        # the KIP-227 fetch session the proxy holds for this client (`intercept.fetch.sessions.FetchSession`); its
        # `release()` runs when the connection closes
        self.fetch_session: Any = None
        self.sasl_rounds: int | None = None  # SASL rounds left before the mechanism's last (pre-auth limit)
        self.sends_files = False  # file regions go onto the client's socket (`proxy.sendfile`); else bytes are read
        self.files: FileSender | None = None
        self.sending: asyncio.Task[None] | None = None  # a response with a file region going out: flush waits
        self.writing_paused = False  # the client's transport holds more than the high water mark
        self.unwritten_reserved = 0  # queued.max.request.bytes held by responses still in that buffer

    def hold_until_written(self, reserved: int) -> None:
        """Give back memory reserved for a response (`ByteBudget.reserve`) once it has left the process: now, or
        when a slow client's transport buffer drains (or the connection closes)."""
        if self.writing_paused and not self.closed:
            self.unwritten_reserved += reserved
        else:
            self.proxy.request_budget.give_back(reserved)

    def writes_drained(self) -> None:
        held, self.unwritten_reserved = self.unwritten_reserved, 0
        if held:
            self.proxy.request_budget.give_back(held)

    # --- client side -------------------------------------------------------------------------------------------
    def client_connected(self, transport: asyncio.Transport) -> None:
        self.client = transport
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        transport.set_write_buffer_limits(high=self.proxy.settings.buffer_high_water_bytes)
        self.sends_files = self.proxy.settings.remote_fetch_file_sendfile and can_send_files(transport)
        self.client_gate.attach(transport)
        self.client_gate.pause("connecting")
        self.proxy.spawn(self._connect_upstream())

    async def _connect_upstream(self) -> None:
        try:
            self.upstream, self.upstream_name = await self.proxy.connect_upstream(self)
        except (TimeoutError, OSError, LookupError) as exc:
            log.warning("client %s: cannot reach broker %s: %s", self.peer,
                        "bootstrap" if self.node_id is None else self.node_id, exc)
            self.close()
            return
        if self.closed:
            self.upstream.close()
            return
        self.upstream.set_write_buffer_limits(high=self.proxy.settings.buffer_high_water_bytes)
        self.upstream_gate.attach(self.upstream)
        self.client_gate.resume("connecting")
        self.process_client()  # frames that arrived while connecting

    def process_client(self) -> None:
        """Handle every whole request received (once the broker connection is made), then reserve what the next
        read allocates against queued.max.request.bytes, or pause reading until it can be."""
        if self.closed:
            return
        if self.upstream is not None:
            self._handle_requests()
        if not self.closed:
            frames = self.server.frames
            self.proxy.request_budget.charge(id(self), frames.budgeted() + frames.growth(), self.client_gate)
            self.client_gate.enforce()

    def _handle_requests(self) -> None:
        self.last_active = self.proxy.loop.time()
        ev = None
        try:
            while not self.closed and (ev := self.server.next_event()) is not None:
                handler = self.proxy.request_handlers.get(ev.header.api_key)
                if handler is None:
                    self.forward(ev)
                else:
                    handler(self, ev)
        except ProtocolError as exc:
            log.warning("client %s: malformed request, closing the connection: %s", self.peer, exc)
            self.close()
        except Exception:  # one error boundary (h11's rule): this connection only, never the process
            log.exception("client %s: handling request %s (correlation id %s) failed; closing the connection",
                          self.peer, ev.header.api_key if ev else "?", ev.header.correlation_id if ev else "?")
            self.close()

    def forward(self, ev: RequestEvent, chunks: list[Buffer] | None = None, slot: Slot | None = None) -> Slot | None:
        """Send a request upstream (its original frame unless `chunks` replace it); return its response slot."""
        assert self.upstream is not None
        if ev.expects_response and slot is None:
            slot = Slot(ev.header)
        if ev.expects_response:
            self.upstream_conn.expect_response(ev.header, slot)
        for chunk in chunks if chunks is not None else as_received(ev):
            self.upstream.write(chunk)
        if slot is not None:
            self.add_slot(slot)
        return slot

    def add_slot(self, slot: Slot) -> None:
        self.slots.append(slot)
        if len(self.slots) >= self.max_in_flight:
            self.client_gate.pause("in_flight")

    def complete_later(self, slot: Slot, work: Coroutine[Any, Any, None]) -> asyncio.Task[Any]:
        """Run `work`, which fills `slot` (and flushes). Should it raise, or end with the slot still empty, the
        connection closes with a log line: an empty slot would hold every later response of this connection
        back forever (h11's rule: any exception moves the connection to an error state)."""
        async def run() -> None:
            try:
                await work
            except Exception:
                log.exception("client %s: completing a deferred %s response failed; closing the connection",
                              self.peer, slot.header.api_key)
                self.close()
                return
            if slot.chunks is None and not self.closed:
                log.error("client %s: a deferred %s response was left empty; closing the connection", self.peer,
                          slot.header.api_key)
                self.close()

        return self.proxy.spawn(run())

    def answer_locally(self, header: RequestHeader, chunks: Chunks) -> None:
        """Queue a response the proxy makes itself, in order with the forwarded ones."""
        self.add_slot(Slot(header, chunks))
        self.flush()

    # --- upstream side -----------------------------------------------------------------------------------------
    def process_upstream(self) -> None:
        self.last_active = self.proxy.loop.time()
        ev = None
        try:
            while not self.closed and (ev := self.upstream_conn.next_event()) is not None:
                slot = ev.context
                handler = self.proxy.response_handlers.get(ev.api_key)
                if slot is None:
                    continue
                if handler is None:
                    slot.chunks = as_received(ev)
                else:
                    handler(self, slot, ev)
                self.flush()
        except ProtocolError as exc:
            log.error("broker %s: malformed response, closing client %s: %s", self.upstream_name, self.peer, exc)
            self.close()
        except Exception:  # one error boundary: this connection only, never the process
            log.exception("client %s: handling the response to %s (correlation id %s) failed; closing the "
                          "connection", self.peer, ev.api_key if ev else "?", ev.correlation_id if ev else "?")
            self.close()

    def flush(self) -> None:
        """Write every ready response at the head of the queue, in order."""
        client = self.client
        if client is None or self.closed:
            return
        if self.sending is not None:
            return  # a file region is going out: the rest follows it (`_send_rest`)
        slots = self.slots
        while slots and slots[0].chunks is not None:
            chunks = slots.popleft().chunks
            assert chunks is not None
            for i, chunk in enumerate(chunks):
                if isinstance(chunk, FileRegion):
                    self.sending = self.proxy.spawn(self._send_rest(chunks[i:]))
                    return
                client.write(chunk)
        if self.client_gate.paused and len(slots) < self.max_in_flight // 2 + 1:
            self.client_gate.resume("in_flight")

    async def _send_rest(self, chunks: Chunks) -> None:
        """A response from its first file region on, then whatever became ready meanwhile. The broker's side is
        not read meanwhile (what it answers waits in the kernel, not here)."""
        client = self.client
        assert client is not None
        self.upstream_gate.pause("sending_file")
        try:
            if self.files is None:
                self.files = FileSender(client, self.proxy.loop)
            for chunk in chunks:
                if self.closed:
                    return
                if isinstance(chunk, FileRegion):
                    await self.files.send(chunk)
                    self.proxy.fetch_stats.sendfile_bytes += chunk.length
                else:
                    client.write(chunk)
        except (OSError, EOFError) as exc:
            if not self.closed:
                log.warning("client %s: sending a tier file region failed, closing the connection: %s", self.peer,
                            exc)
                self.close()
            return
        finally:
            self.sending = None
            self.upstream_gate.resume("sending_file")
        self.flush()

    # --- lifecycle ---------------------------------------------------------------------------------------------
    @property
    def idle(self) -> bool:
        return not self.slots and self.upstream_conn.in_flight == 0

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.fetch_session is not None:
            self.fetch_session.release()
            self.fetch_session = None
        if self.files is not None:
            self.files.close()
        for t in (self.client, self.upstream):
            if t is not None and not t.is_closing():
                t.close()
        for slot in self.slots:  # responses that will never be written: what they hold goes back now
            if slot.on_drop is not None:
                slot.on_drop()
        self.writes_drained()
        self.proxy.session_closed(self)


class ClientProtocol(asyncio.BufferedProtocol):
    """The client-facing side: bytes land in the session's request frame buffer."""

    def __init__(self, proxy: ProxyContext, node_id: int | None) -> None:
        self.proxy = proxy
        self.node_id = node_id
        self.session: Session | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # a stream transport (uvloop's is one without subclassing asyncio.Transport)
        transport = cast(asyncio.Transport, transport)
        if not self.proxy.accepting(transport):
            transport.abort()
            return
        self.session = Session(self.proxy, self.node_id)
        self.proxy.session_opened(self.session)
        self.session.client_connected(transport)

    def get_buffer(self, sizehint: int) -> memoryview:
        assert self.session is not None
        return self.session.server.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        session = self.session
        assert session is not None
        session.server.buffer_updated(nbytes)
        session.process_client()

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if self.session is not None:
            self.session.close()

    def pause_writing(self) -> None:
        if self.session is not None:
            self.session.writing_paused = True
            self.session.upstream_gate.pause("client_slow")

    def resume_writing(self) -> None:
        if self.session is not None:
            self.session.writing_paused = False
            self.session.writes_drained()
            self.session.upstream_gate.resume("client_slow")


class UpstreamProtocol(asyncio.BufferedProtocol):
    """The broker-facing side: bytes land in the session's response frame buffer."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.frames = session.upstream_conn.frames

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.frames.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        frames = self.frames
        frames.buffer_updated(nbytes)
        if not frames.inside_large_frame():  # a large response arrives in many reads: act on its last one only
            self.session.process_upstream()

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.session.closed:
            log.info("broker %s closed the connection of client %s%s", self.session.upstream_name,
                     self.session.peer, f": {exc}" if exc else "")
        self.session.close()

    def pause_writing(self) -> None:
        self.session.client_gate.pause("upstream_slow")

    def resume_writing(self) -> None:
        self.session.client_gate.resume("upstream_slow")
