"""File regions onto a client's socket with `os.sendfile`, in order with what its transport writes.

A tier of files answers a catch-up Fetch with regions of its segment files (`protocol.primitives.FileRegion`);
they go from the page cache to the socket as the broker sends its own log, never through Python. The transport's
buffer is drained first (its bytes come before the region on the wire), then the region is sent on the socket
itself. uvloop refuses a watcher on a transport's own descriptor, so writability is watched on a duplicate of it
(one socket, two descriptors). Only plain TCP sockets qualify: a TLS listener's bytes must pass through its
encryption, so those connections are answered with bytes, as from S3 (`can_send_files`).
"""

from __future__ import annotations

import asyncio
import os

from protocol.primitives import FileRegion

MAX_DRAIN_WAITS = 1 << 20  # a bound on the loop that waits for the transport's buffer (each wait is a writable event)
# at most this much per sendfile call, then the loop runs what else is ready: a socket's buffer grows to megabytes,
# and one call copying them holds every other connection of the process (a tail fetch beside catch-ups) that long
SLICE = 256 * 1024


def can_send_files(transport: asyncio.BaseTransport) -> bool:
    """A plain TCP socket under the transport: file regions can go straight onto it."""
    if transport.get_extra_info("sslcontext") is not None or transport.get_extra_info("ssl_object") is not None:
        return False
    sock = transport.get_extra_info("socket")
    return sock is not None and hasattr(sock, "fileno") and sock.fileno() >= 0


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class FileSender:
    """Sends file regions on one client connection's socket (made when its first region is sent)."""

    def __init__(self, transport: asyncio.WriteTransport, loop: asyncio.AbstractEventLoop) -> None:
        self.transport = transport
        self.loop = loop
        self.fd = os.dup(transport.get_extra_info("socket").fileno())
        self.watching = False
        self.waiter: asyncio.Future[None] | None = None
        self.closed = False
        self.sending = False  # a send owns the descriptor: `close` leaves closing it to that send
        self.sent = 0  # bytes sent from files

    async def send(self, region: FileRegion) -> None:
        """Everything the transport holds, then the region. OSError when the socket or the file fails, EOFError
        when the file is shorter than the region (nothing else may fill the answer's announced length),
        ConnectionError when the connection closed meanwhile."""
        if self.closed:
            raise ConnectionError("connection closed")
        self.sending = True
        try:
            await self._send(region)
        finally:
            self.sending = False
            if self.closed:  # closed while this send waited: its descriptor is closed now, never before
                os.close(self.fd)

    async def _send(self, region: FileRegion) -> None:
        for _ in range(MAX_DRAIN_WAITS):
            if not self.transport.get_write_buffer_size():
                break
            await self._writable()
        else:
            raise OSError("the client's transport did not drain")
        pos, end = region.position, region.position + region.length
        while pos < end:
            try:
                n = os.sendfile(self.fd, region.fd, pos, min(end - pos, SLICE))
            except BlockingIOError:
                await self._writable()
                continue
            if n == 0:
                raise EOFError(f"the segment file ends at {pos}, inside a region sent up to {end}")
            pos += n
            self.sent += n
            if pos < end:
                await asyncio.sleep(0)  # the other connections' ready work, then the next slice
                if self.closed:
                    raise ConnectionError("connection closed")

    async def _writable(self) -> None:
        if self.closed:
            raise ConnectionError("connection closed")
        waiter = self.waiter = self.loop.create_future()
        self.loop.add_writer(self.fd, _wake, waiter)
        self.watching = True
        try:
            await waiter
        finally:
            self.waiter = None
            if self.watching:
                self.loop.remove_writer(self.fd)
                self.watching = False
        if self.closed:  # the socket turned writable, then the connection closed before this task ran again
            raise ConnectionError("connection closed")

    def close(self) -> None:
        """No write after this; the descriptor is closed now, or by the send that owns it when it stops (until
        then its number cannot be another socket's)."""
        if self.closed:
            return
        self.closed = True
        if self.watching:
            self.loop.remove_writer(self.fd)
            self.watching = False
        if self.waiter is not None and not self.waiter.done():  # the send waiting on it ends now
            self.waiter.set_exception(ConnectionError("connection closed"))
        if not self.sending:
            os.close(self.fd)
