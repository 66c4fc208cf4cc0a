"""Ranged GETs of S3 objects with the body received straight into one buffer of its size.

Under aiobotocore, aiohttp hands a body over as the socket gives it: a callback, a `bytes` object, a deque append
and a task wake-up per receive, a pause and a resume of the transport per 128 KiB buffered, and a join at the end.
At the hundreds of MB/s of a catch-up that was most of the proxy's CPU per GB served from S3 (1.2 of 1.75
core-s/GB). Here a ranged GET is signed by botocore (a presigned URL: query authentication, which every S3 API
takes; the Range header is not signed), sent on a kept-alive HTTP/1.1 connection, and its body is received with
`recv_into` straight into a bytearray of its Content-Length: one short Python call per receive, no copy after
the kernel's.

Bodies of the same size (the reader's chunks) are received into buffers used before, once nothing refers to
them any more (`BodyBuffers`): a new 8 MiB bytearray is zeroed by the C library and, where its pages are fresh,
faulted in a page at a time: ~15 % of the proxy's CPU per GB read from S3 (an A/B of the S3 CPU benchmark).

The client knows the one response shape S3 gives a GET: a status line, headers, a body of Content-Length bytes.
Anything else (a chunked or unsized body, an oversized head) raises `Unsupported`, and the caller asks the full
client instead, so nothing depends on a store answering exactly as S3 does.
"""

from __future__ import annotations

import asyncio
import re
import ssl
import sys
from collections.abc import Callable
from typing import cast
from urllib.parse import urlsplit

HEAD_LIMIT = 64 * 1024  # a response head (status line and headers) longer than this is not S3's
ERROR_BODY_LIMIT = 64 * 1024  # an error's XML body longer than this is not S3's
MAX_IDLE = 64  # kept-alive connections per endpoint, as the full client's pool
_CODE = re.compile(rb"<Code>([^<]{1,100})</Code>")


class Unsupported(Exception):
    """A response this client does not read (the full client is asked instead)."""


class HttpStatus(Exception):
    """A whole response whose status is not 200/206: `status` and the S3 error `code` of its XML body."""

    def __init__(self, status: int, code: str) -> None:
        super().__init__(f"HTTP {status} {code}".rstrip())
        self.status, self.code = status, code


def _counts(bufs: list[bytearray]) -> list[int]:
    """Each buffer's reference count as `BodyBuffers` reads it (one code path for the check and its baseline)."""
    return [sys.getrefcount(buf) for buf in bufs]


def _count_when_alone() -> int | None:
    """What `_counts` reads for a buffer that only its list holds, measured; None on an interpreter whose count
    does not rise with one more reference (no buffer is ever reused there)."""
    kept = [bytearray(1)]
    alone = _counts(kept)[0]
    other = kept[0]
    held = _counts(kept)[0]
    del other
    return alone if held > alone else None


_ALONE = _count_when_alone()


class BodyBuffers:
    """Buffers for response bodies, each used again for a body of its size once nothing else refers to it.

    A buffer is reused only when CPython's reference count says that only this pool holds it: no cache entry, no
    answer's view of it (a `memoryview` slice keeps its buffer referenced), no task. So bytes a client is still
    being sent are never overwritten, whatever holds them and for however long. At most `keep_bytes` of buffers
    are kept; a kept buffer nobody uses is memory the reads' bound (the chunk cache) allowed already.
    """

    MIN_BYTES = 256 << 10  # smaller bodies (indexes, error bodies) are cheap to allocate

    def __init__(self, keep_bytes: int = 0) -> None:
        self.keep_bytes = keep_bytes
        self.kept: list[bytearray] = []
        self.kept_bytes = 0
        self.reused = 0

    def _unused(self) -> list[bytearray]:
        # held by the pool's list and by nothing else (the count's baseline is measured, not assumed: what a
        # reference on the interpreter's own stack adds differs between CPython versions)
        if _ALONE is None:
            return []
        return [buf for buf, count in zip(self.kept, _counts(self.kept), strict=True) if count <= _ALONE]

    def take(self, length: int) -> bytearray:
        """A buffer of exactly `length` bytes (its contents whatever it held before)."""
        if length < self.MIN_BYTES or not self.keep_bytes:
            return bytearray(length)
        unused = self._unused()
        for buf in unused:
            if len(buf) == length:
                self.reused += 1
                return buf
        # room made by letting go of unused ones of other sizes (one of this size would have been taken), where
        # that makes enough
        if self.kept_bytes + length > self.keep_bytes >= self.kept_bytes - sum(map(len, unused)) + length:
            for buf in unused:
                self.kept = [b for b in self.kept if b is not buf]  # by identity: `remove` compares contents
                self.kept_bytes -= len(buf)
                if self.kept_bytes + length <= self.keep_bytes:
                    break
        buf = bytearray(length)
        if self.kept_bytes + length <= self.keep_bytes:
            self.kept.append(buf)
            self.kept_bytes += length
        return buf


class _Connection(asyncio.BufferedProtocol):
    """One HTTP/1.1 connection; one response at a time, its body received in place."""

    def __init__(self, bodies: BodyBuffers | None = None) -> None:
        self.bodies = bodies or BodyBuffers()
        self.transport: asyncio.Transport | None = None
        self.scratch = bytearray(HEAD_LIMIT)
        self.head = 0  # bytes of the head received into `scratch`
        self.body: bytearray | None = None
        self.filled = 0
        self.status = 0
        self.ranged = False  # a Range was asked: a 200 (the whole object) is not the answer
        self.most: int | None = None  # the most body bytes a 206 may bring (the range asked)
        self.done: asyncio.Future[None] | None = None
        self.reusable = True

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is a stream transport without subclassing

    def connection_lost(self, exc: Exception | None) -> None:
        self.reusable = False
        self._fail(ConnectionError(f"the S3 connection closed after {self.filled} body bytes"
                                   + (f": {exc}" if exc else "")))

    def expect(self, loop: asyncio.AbstractEventLoop, ranged: bool, most: int | None) -> asyncio.Future[None]:
        self.head, self.body, self.filled, self.status = 0, None, 0, 0
        self.ranged, self.most = ranged, most
        self.done = loop.create_future()
        return self.done

    def get_buffer(self, sizehint: int) -> memoryview:
        if self.body is not None and self.filled < len(self.body):
            return memoryview(self.body)[self.filled:]
        if self.head >= HEAD_LIMIT:  # bytes past a finished response or a head too long: thrown away, then closed
            self.head = 0
        return memoryview(self.scratch)[self.head:]

    def buffer_updated(self, nbytes: int) -> None:
        if self.done is None or self.done.done():  # bytes nobody asked for: not a connection to reuse
            self.reusable = False
            assert self.transport is not None
            self.transport.close()
            return
        if self.body is not None:
            self.filled += nbytes
            if self.filled == len(self.body):
                self.done.set_result(None)
            return
        self.head += nbytes
        end = self.scratch.find(b"\r\n\r\n", 0, self.head)
        if end < 0:
            if self.head >= HEAD_LIMIT:
                self._fail(Unsupported(f"a response head over {HEAD_LIMIT} bytes"))
            return
        try:
            length = self._read_head(bytes(self.scratch[:end]))
        except Unsupported as exc:
            self._fail(exc)
            return
        extra = self.head - (end + 4)
        if extra > length:
            self._fail(Unsupported("more bytes than the response's Content-Length"))
            return
        # a buffer used before, or one from the heap, where `remote.allocator` keeps freed chunks' pages for the next
        # ones (a mapping of its own per body, huge pages or not, cost 3-6x the CPU per GiB measured)
        self.body = self.bodies.take(length) if self.status in (200, 206) else bytearray(length)
        memoryview(self.body)[:extra] = memoryview(self.scratch)[end + 4:self.head]
        self.filled = extra
        if self.filled == length:
            self.done.set_result(None)

    def _read_head(self, head: bytes) -> int:
        lines = head.split(b"\r\n")
        version, _, rest = lines[0].partition(b" ")
        try:
            self.status = int(rest[:3])
        except ValueError:
            raise Unsupported(f"status line {lines[0][:80]!r}") from None
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip().lower()
        if b"transfer-encoding" in headers or b"content-length" not in headers:
            raise Unsupported("a response body without a Content-Length")
        connection = headers.get(b"connection", b"")
        if connection == b"close" or (version != b"HTTP/1.1" and connection != b"keep-alive"):
            self.reusable = False
        try:
            length = int(headers[b"content-length"])
        except ValueError:
            raise Unsupported(f"Content-Length {headers[b'content-length'][:40]!r}") from None
        if length < 0:
            raise Unsupported(f"Content-Length {length}")
        # checked before a byte of the body is taken in: memory follows the request, not what the store claims
        if self.status == 200 and self.ranged:
            raise Unsupported("the store ignored the Range header")
        if self.status == 206 and self.most is not None and length > self.most:
            raise Unsupported(f"a body of {length} bytes for a range of {self.most}")
        if self.status not in (200, 206) and length > ERROR_BODY_LIMIT:
            raise Unsupported(f"an HTTP {self.status} body of {length} bytes")
        return length

    def _fail(self, exc: Exception) -> None:
        self.reusable = False
        if self.done is not None and not self.done.done():
            self.done.set_exception(exc)
        if self.transport is not None:
            self.transport.close()


class RangedGets:
    """Ranged GETs of presigned URLs over kept-alive connections (`MAX_IDLE` idle ones per endpoint)."""

    def __init__(self, ssl_context: Callable[[], ssl.SSLContext], connect_timeout: float = 5.0,
                 read_timeout: float = 30.0, bodies: BodyBuffers | None = None) -> None:
        self.bodies = bodies or BodyBuffers()
        self.make_ssl_context = ssl_context  # made on the first https connection (reading a CA bundle takes a while)
        self.ssl_context: ssl.SSLContext | None = None
        self.connect_timeout, self.read_timeout = connect_timeout, read_timeout
        self.idle: dict[tuple[asyncio.AbstractEventLoop, str, int, bool], list[_Connection]] = {}  # by loop too

    async def get(self, url: str, start: int, end: int | None) -> bytearray:
        """Bytes [start, end) of the object at `url` (to its end when `end` is None). Raises HttpStatus for a
        status other than 200/206, Unsupported, OSError/ConnectionError/TimeoutError for the connection."""
        parts = urlsplit(url)
        https = parts.scheme == "https"
        endpoint = (asyncio.get_running_loop(), parts.hostname or "", parts.port or (443 if https else 80), https)
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        request = (f"GET {target} HTTP/1.1\r\nHost: {parts.netloc}\r\nRange: bytes={start}-"
                   f"{'' if end is None else end - 1}\r\nAccept-Encoding: identity\r\n"
                   f"User-Agent: tierproxy\r\n\r\n").encode("ascii")
        for attempt in range(2):  # a kept-alive connection the store closed meanwhile: once more on a new one
            conn, reused = await self._connection(endpoint)
            done = conn.expect(asyncio.get_running_loop(), bool(start or end is not None),
                               None if end is None else end - start)
            assert conn.transport is not None
            conn.transport.write(request)
            try:
                await asyncio.wait_for(done, self.read_timeout)
            except ConnectionError:
                if reused and attempt == 0 and conn.head == 0:
                    continue
                raise
            except BaseException:
                conn.reusable = False
                conn.transport.close()
                raise
            body, conn.body = conn.body, None  # an idle connection holds no body (it could not be reused)
            assert body is not None
            self._release(endpoint, conn)
            if conn.status in (200, 206):
                return body
            found = _CODE.search(body)
            raise HttpStatus(conn.status, found.group(1).decode("ascii", "replace") if found else "")
        raise AssertionError("unreachable")

    async def _connection(self, endpoint: tuple[asyncio.AbstractEventLoop, str, int, bool]
                          ) -> tuple[_Connection, bool]:
        pool = self.idle.get(endpoint)
        while pool:
            conn = pool.pop()
            if conn.reusable and conn.transport is not None and not conn.transport.is_closing():
                return conn, True
        loop, host, port, https = endpoint
        if https and self.ssl_context is None:
            self.ssl_context = self.make_ssl_context()
        _, conn = await asyncio.wait_for(loop.create_connection(
            lambda: _Connection(self.bodies), host, port, ssl=self.ssl_context if https else None),
            self.connect_timeout)
        return conn, False

    def _release(self, endpoint: tuple[asyncio.AbstractEventLoop, str, int, bool], conn: _Connection) -> None:
        pool = self.idle.setdefault(endpoint, [])
        if conn.reusable and len(pool) < MAX_IDLE:
            pool.append(conn)
        elif conn.transport is not None:
            conn.transport.close()

    def close(self) -> None:
        for pool in self.idle.values():
            for conn in pool:
                if conn.transport is not None:
                    conn.transport.close()
        self.idle.clear()
