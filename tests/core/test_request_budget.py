"""`queued.max.request.bytes` against clients that announce huge requests and send part of them: the request
buffers of every connection together stay within the bound (plus each connection's own floor, plus the one
growth Kafka's pool also lets through), however unevenly the connections' bytes arrive. The real `ClientProtocol`
and `Session` receive as the event loop drives a BufferedProtocol: `get_buffer`, bytes written into it,
`buffer_updated`; a paused connection is not read."""

from __future__ import annotations

import asyncio
import struct

import pytest

from protocol.constants import ApiKey
from protocol.headers import RequestHeader
from tests.support.inprocess import InProcessProxy, Wire, run
from tierproxy.proxy.session import ClientProtocol, Session

LIMIT, FLOOR = 8 << 20, 64 * 1024
CONNECTIONS, SENT = 50, 1 << 20  # each announces 90 MiB and has 1 MiB of it in the kernel


def _read_once(protocol: ClientProtocol, pending: bytearray, most: int) -> int:
    """One read callback of the loop: the protocol's region, filled with what the socket holds (at most `most`)."""
    region = protocol.get_buffer(-1)
    n = min(len(region), len(pending), most)
    region[:n] = pending[:n]
    region.release()
    del pending[:n]
    protocol.buffer_updated(n)
    return n


def _connected(proxy: InProcessProxy) -> tuple[ClientProtocol, Wire]:
    """A client connection as the server makes one: its protocol on a session whose reads the budget can pause."""
    wire = Wire(proxy)
    protocol = ClientProtocol(proxy, None)
    protocol.session = wire.session
    wire.session.client_gate.attach(wire.client)
    return protocol, wire


def test_request_buffers_stay_within_the_bound_however_unevenly_clients_send() -> None:
    async def scenario() -> None:
        proxy = InProcessProxy(queued_max_request_bytes=LIMIT)
        budget = proxy.request_budget
        header = RequestHeader(ApiKey.PRODUCE, 9, 1, "claims", 2, 0).encode()
        conns = []
        for _ in range(CONNECTIONS):
            protocol, wire = _connected(proxy)
            conns.append((protocol, wire, bytearray(struct.pack(">i", 90 << 20) + header + bytes(SENT))))
        peak = growth = 0

        def turns(n: int) -> None:
            nonlocal peak, growth
            for turn in range(n):
                for i, (protocol, wire, pending) in enumerate(conns):
                    if wire.client.is_reading() and pending and protocol.session and not protocol.session.closed:
                        # uneven: some sockets hold a little at each turn, some a lot (a loaded machine reads late)
                        before = protocol.session.server.frames.allocated()
                        _read_once(protocol, pending, 4096 << (i + turn) % 8)
                        growth = max(growth, protocol.session.server.frames.allocated() - before)
                held = sum(p.session.server.frames.allocated() for p, _, _ in conns if p.session
                           and not p.session.closed)
                peak = max(peak, held)

        turns(200)
        paused = [w for _, w, p in conns if not w.client.is_reading() and p]
        assert paused and budget.pauses >= len(paused)  # backpressure: the clients sent far more than the bound
        # Kafka's pool (non-strict) grants an allocation while any memory is left: one growth may pass the bound
        bound = LIMIT + CONNECTIONS * FLOOR + growth
        assert peak <= bound, f"request buffers hold {peak / 2**20:.1f} MiB (bound {LIMIT >> 20} MiB + " \
                              f"{CONNECTIONS} x 64 KiB + one growth of {growth >> 10} KiB)"
        # ...and the connection that has held budget the longest grows its request whatever is left (no deadlock)
        largest = max(p.session.server.frames.budgeted() - FLOOR for p, _, _ in conns if p.session)
        assert budget.used <= LIMIT + growth + largest
        # connections that close give their bytes back: the paused ones are read again, still within the bound
        for protocol, _, pending in conns[:CONNECTIONS // 2]:
            pending.clear()
            protocol.connection_lost(None)
        left = sum(len(p) for _, _, p in conns)
        turns(200)
        assert sum(len(p) for _, _, p in conns) < left and peak <= bound
    run(scenario())


class _Connecting(InProcessProxy):
    """A proxy whose broker connection is still being made (until the test ends)."""

    async def connect_upstream(self, session: Session) -> tuple[asyncio.Transport, str]:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_client_is_not_read_while_its_broker_connection_is_being_made(loop: str) -> None:
    """Reading pauses while the broker connection is made (nothing can be forwarded yet): uvloop starts reading
    after `connection_made` whatever it paused, so the pause holds from the first read on, and what a client
    pipelines meanwhile waits in the kernel, not in the proxy. A real loop and real sockets."""
    proxy = _Connecting()
    frame = RequestHeader(ApiKey.API_VERSIONS, 3, 1, "eager", 2, 0).encode() + bytes(1000)
    burst = (struct.pack(">i", len(frame)) + frame) * 1000  # 1 MiB of small requests, sent at once

    async def scenario() -> None:
        protocols: list[ClientProtocol] = []

        def accept() -> ClientProtocol:
            protocols.append(ClientProtocol(proxy, None))
            return protocols[-1]

        server = await asyncio.get_running_loop().create_server(accept, "127.0.0.1", 0)
        _, writer = await asyncio.open_connection("127.0.0.1", server.sockets[0].getsockname()[1])
        try:
            writer.write(burst)
            for _ in range(200):  # loop turns (bounded): a transport still reading takes the burst meanwhile
                await asyncio.sleep(0)
            session = protocols[0].session
            assert session is not None and session.client is not None
            assert not session.client.is_reading()
            assert session.server.frames.allocated() <= 64 * 1024, f"{session.server.buffered()} bytes read"
        finally:  # the connection and its pending broker connection end with the test
            for p in protocols:
                if p.session is not None:
                    p.session.close()
            writer.transport.abort()
            server.close()
            await server.wait_closed()

    if loop == "uvloop":
        import uvloop
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(scenario())
    else:
        run(scenario())


@pytest.mark.parametrize(("connections", "size"), [(1, 12 << 20), (3, 6 << 20)])
def test_requests_larger_together_than_the_bound_are_all_received(connections: int, size: int) -> None:
    """Clients that send whole requests (a Produce larger than the bound, or several that together are) get them
    all through, one after another: a connection whose request is under way is never left waiting for budget that
    only waiting connections hold (hold-and-wait). Kafka's pool grants a request its whole size at once, so a granted
    request completes and gives its memory back."""
    async def scenario() -> None:
        proxy = InProcessProxy(queued_max_request_bytes=LIMIT)
        header = RequestHeader(ApiKey.PRODUCE, 9, 1, "big", 2, 0).encode()
        conns = []
        for _ in range(connections):
            protocol, wire = _connected(proxy)
            body = header + bytes(size - len(header))
            conns.append((protocol, wire, bytearray(struct.pack(">i", len(body)) + body)))
        for _ in range(2000):  # loop turns (bounded): 1 MiB per read at most
            for protocol, wire, pending in conns:
                if wire.client.is_reading() and pending:
                    _read_once(protocol, pending, 1 << 20)
        left = [len(p) for _, _, p in conns]
        assert not any(left), f"bytes never read (reading paused for good): {left}; {proxy.request_budget.used=}"
    run(scenario())
