"""A loopback HTTP relay in front of the moto S3 server that breaks some ranged GETs the way S3 and networks do:
503 SlowDown, a connection reset mid-body, a body cut short (FIN), or a body with a flipped byte."""

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
    _n: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def fault_now(self, head: bytes) -> str | None:
        if self.mode == "none" or not head.startswith(b"GET ") or b".log" not in head.split(b"\r\n", 1)[0]:
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
            body = _read_exact(c, buf, _length(head))
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
def fault_relay(moto_endpoint: str) -> Iterator[FaultRelay]:
    host, _, port = moto_endpoint.removeprefix("http://").rpartition(":")
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
