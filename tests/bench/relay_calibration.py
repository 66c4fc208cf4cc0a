"""The rate of a bare user-space relay on this machine: what any proxy's tail is measured against.

    python tests/bench/relay_calibration.py direct|relay [asyncio|uvloop] [MiB]

A writer process sends MiB mebibytes over loopback to a reader thread, either straight (`direct`) or through a
minimal asyncio relay (`relay`: a BufferedProtocol that forwards each read into the other socket as it arrives,
with flow control both ways, no parsing). Prints `MODE LOOP MB/s`.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import threading
import time

CHUNK = 1 << 20


def _write(port: int, total: int) -> None:
    s = socket.create_connection(("127.0.0.1", port))
    block = bytes(CHUNK)
    sent = 0
    while sent < total:
        s.sendall(block)
        sent += CHUNK
    s.close()


def _read(listener: socket.socket, result: list[tuple[int, float]]) -> None:
    conn, _ = listener.accept()
    buf = bytearray(4 << 20)
    got, started = 0, time.perf_counter()
    while (n := conn.recv_into(buf)) > 0:
        got += n
    result.append((got, time.perf_counter() - started))


class _Upstream(asyncio.Protocol):
    """The relay's connection to the reader: its write buffer filling pauses the client side."""

    def __init__(self, client: _Client) -> None:
        self.client = client

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def pause_writing(self) -> None:
        self.client.transport.pause_reading()

    def resume_writing(self) -> None:
        self.client.transport.resume_reading()


class _Client(asyncio.BufferedProtocol):
    """The writer's side: each read goes on at once (cut-through)."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.buffer = bytearray(CHUNK)
        self.upstream: _Upstream | None = None
        self.early: list[bytes] = []  # read before the upstream connection is up (uvloop may read at once)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: asyncio.Transport = transport  # type: ignore[assignment]
        self.transport.pause_reading()
        asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        _, upstream = await asyncio.get_running_loop().create_connection(
            lambda: _Upstream(self), "127.0.0.1", self.target)
        for data in self.early:
            upstream.transport.write(data)  # type: ignore[attr-defined]
        self.upstream, self.early = upstream, []
        self.transport.resume_reading()

    def get_buffer(self, sizehint: int) -> bytearray:
        return self.buffer

    def buffer_updated(self, nbytes: int) -> None:
        data = bytes(memoryview(self.buffer)[:nbytes])
        if self.upstream is None:
            self.early.append(data)
        else:
            self.upstream.transport.write(data)  # type: ignore[attr-defined]

    def eof_received(self) -> bool:
        if self.upstream is not None:
            self.upstream.transport.close()
        return False


async def measure(mode: str, total: int) -> float:
    """MB/s from the writer to the reader, `direct` or through the `relay`."""
    listener = socket.create_server(("127.0.0.1", 0))
    result: list[tuple[int, float]] = []
    reader = threading.Thread(target=_read, args=(listener, result))
    reader.start()
    port = listener.getsockname()[1]
    if mode == "relay":
        target = port
        server = await asyncio.get_running_loop().create_server(lambda: _Client(target), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
    pid = os.fork()  # the writer in its own process: the relay is the only Python on this process's hot path
    if pid == 0:
        _write(port, total)
        os._exit(0)
    while reader.is_alive():
        await asyncio.sleep(0.02)
    os.waitpid(pid, 0)
    got, seconds = result[0]
    assert got == total, (got, total)
    return got / seconds / 1e6


def main() -> None:
    mode = sys.argv[1]
    loop = sys.argv[2] if len(sys.argv) > 2 else "asyncio"
    total = (int(sys.argv[3]) if len(sys.argv) > 3 else 1024) << 20
    if mode not in ("direct", "relay") or loop not in ("asyncio", "uvloop"):
        raise SystemExit(__doc__)
    if loop == "uvloop":
        import uvloop

        rate = uvloop.run(measure(mode, total))
    else:
        rate = asyncio.run(measure(mode, total))
    print(f"{mode} {loop} {rate:.0f} MB/s")


if __name__ == "__main__":
    main()
