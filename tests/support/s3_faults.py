"""A loopback HTTP relay in front of the S3 server that breaks some requests the way S3 and networks do: ranged GETs
of segment logs (503 SlowDown, a connection reset mid-body, a body cut short (FIN), a body with a flipped byte), or
uploads (`method="PUT"`: 503 SlowDown). Request bodies may be chunked (botocore's aws-chunked uploads)."""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field

SLOWDOWN = (b"HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\nContent-Length: {n}\r\n\r\n",
            b"<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>SlowDown</Code>"
            b"<Message>Please reduce your request rate.</Message></Error>")


@dataclass
class FaultRelay:
    endpoint: str
    mode: str = "none"  # none | slowdown | reset | truncate | corrupt
    every: int = 2  # fault one GET of a segment log in `every`
    limit: int = 4  # faults per mode at most (a store that is broken for good is another test)
    counts: dict[str, int] = field(default_factory=dict)  # faults injected per mode
    method: str = "GET"  # GET: ranged reads of segment logs; PUT: every upload (objects and parts)
    _n: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def fault_now(self, head: bytes) -> str | None:
        if self.mode == "none" or not head.startswith(self.method.encode() + b" "):
            return None
        if self.method == "GET" and b".log" not in head.split(b"\r\n", 1)[0]:
            return None
        with self._lock:
            self._n += 1
            if self._n % self.every or self.counts.get(self.mode, 0) >= self.limit:
                return None
            self.counts[self.mode] = self.counts.get(self.mode, 0) + 1
            return self.mode


def _read_head(s: socket.socket, buf: bytearray) -> bytes | None:
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(65536)
        if not chunk:
            return None
        buf += chunk
    i = buf.index(b"\r\n\r\n") + 4
    head = bytes(buf[:i])
    del buf[:i]
    return head


def _length(head: bytes) -> int:
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":", 1)[1])
    return 0


def _read_line(s: socket.socket, buf: bytearray) -> bytes:
    while b"\r\n" not in buf:
        chunk = s.recv(65536)
        if not chunk:
            raise ConnectionError("short")
        buf += chunk
    line = bytes(buf[:buf.index(b"\r\n") + 2])
    del buf[:len(line)]
    return line


def _read_body(s: socket.socket, buf: bytearray, head: bytes) -> bytes:
    """The request body as sent: Content-Length bytes, or every chunk of a chunked one (trailers included)."""
    if b"transfer-encoding: chunked" not in head.lower():
        return _read_exact(s, buf, _length(head))
    out = bytearray()
    while True:
        line = _read_line(s, buf)
        out += line
        size = int(line.split(b";", 1)[0].strip(), 16)
        if size:
            out += _read_exact(s, buf, size + 2)
            continue
        while (trailer := _read_line(s, buf)) != b"\r\n":  # trailers, then the empty line
            out += trailer
        return bytes(out + trailer)


def _read_exact(s: socket.socket, buf: bytearray, n: int) -> bytes:
    while len(buf) < n:
        chunk = s.recv(65536)
        if not chunk:
            raise ConnectionError("short")
        buf += chunk
    out = bytes(buf[:n])
    del buf[:n]
    return out


def _serve_client(c: socket.socket, relay: FaultRelay, target: tuple[str, int]) -> None:
    buf = bytearray()
    try:
        while (head := _read_head(c, buf)) is not None:
            if b"\r\nexpect: 100-continue" in head.lower():  # botocore asks before each upload's body
                c.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
                head = b"\r\n".join(line for line in head.split(b"\r\n")
                                     if not line.lower().startswith(b"expect:"))  # not signed: dropped upstream
            body = _read_body(c, buf, head)
            fault = relay.fault_now(head)
            if fault == "slowdown":
                c.sendall(SLOWDOWN[0].replace(b"{n}", str(len(SLOWDOWN[1])).encode()) + SLOWDOWN[1])
                continue
            with socket.create_connection(target) as u:
                u.sendall(head + body)
                ubuf = bytearray()
                rhead = _read_head(u, ubuf)
                if rhead is None:
                    return
                rbody = _read_exact(u, ubuf, _length(rhead))
            if fault in ("reset", "truncate") and len(rbody) > 1:
                c.sendall(rhead + rbody[: len(rbody) // 2])
                if fault == "reset":  # RST instead of FIN
                    c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                return
            if fault == "corrupt" and rbody:
                mid = len(rbody) // 2
                rbody = rbody[:mid] + bytes([rbody[mid] ^ 0xFF]) + rbody[mid + 1:]
            c.sendall(rhead + rbody)
    except OSError:
        pass
    finally:
        c.close()


@contextmanager
def fault_relay(s3_endpoint: str) -> Iterator[FaultRelay]:
    host, _, port = s3_endpoint.removeprefix("http://").rpartition(":")
    srv = socket.create_server(("127.0.0.1", 0))
    srv.settimeout(0.2)
    relay = FaultRelay(f"http://127.0.0.1:{srv.getsockname()[1]}")
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                c, _ = srv.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=_serve_client, args=(c, relay, (host, int(port))), daemon=True).start()

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        yield relay
    finally:
        stop.set()
        t.join(5)
        with suppress(OSError):
            srv.close()
