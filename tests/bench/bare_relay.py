"""A bare TCP relay: what any user-space proxy's tail is measured against, side by side with tierproxy.

    python -m tests.bench.bare_relay LISTEN_PORT TARGET_PORT [asyncio|uvloop]

Each accepted connection gets one upstream connection to TARGET_PORT; every read on either side is written to the
other as it arrives (cut-through, 1 MiB reads into a reused buffer, no parsing), with flow control both ways (a
full write buffer pauses reading on the other side). Nothing else: no framing, no rewriting.
"""

from __future__ import annotations

import asyncio
import sys

CHUNK = 1 << 20


class _Side(asyncio.BufferedProtocol):
    """One side of a relayed connection; `peer` is the other side."""

    def __init__(self) -> None:
        self.buffer = bytearray(CHUNK)
        self.peer: _Side | None = None
        self.transport: asyncio.Transport | None = None
        self.early: list[bytes] = []  # read before the other side is connected

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def get_buffer(self, sizehint: int) -> bytearray:
        return self.buffer

    def buffer_updated(self, nbytes: int) -> None:
        data = bytes(memoryview(self.buffer)[:nbytes])
        if self.peer is None or self.peer.transport is None:
            self.early.append(data)
        else:
            self.peer.transport.write(data)

    def pause_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.resume_reading()

    def eof_received(self) -> bool:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.close()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.close()


class _Client(_Side):
    def __init__(self, target: int) -> None:
        super().__init__()
        self.target = target

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        transport.pause_reading()  # type: ignore[attr-defined]
        asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        upstream = _Side()
        upstream.peer = self
        await asyncio.get_running_loop().create_connection(lambda: upstream, "127.0.0.1", self.target)
        self.peer = upstream
        assert upstream.transport is not None and self.transport is not None
        for data in self.early:
            upstream.transport.write(data)
        self.early = []
        self.transport.resume_reading()


async def serve(listen: int, target: int) -> None:
    server = await asyncio.get_running_loop().create_server(lambda: _Client(target), "127.0.0.1", listen)
    print(f"relaying 127.0.0.1:{listen} -> 127.0.0.1:{target}", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    listen, target = int(sys.argv[1]), int(sys.argv[2])
    if (sys.argv[3] if len(sys.argv) > 3 else "uvloop") == "uvloop":
        import uvloop

        uvloop.run(serve(listen, target))
    else:
        asyncio.run(serve(listen, target))


if __name__ == "__main__":
    main()
