"""A recording TCP relay for tests: forwards bytes both ways and records every whole Kafka frame it carries."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from protocol.framing import FrameBuffer


@dataclass
class Capture:
    """One relayed connection: request frames (client → broker) and response frames (broker → client)."""

    conn_id: int
    requests: list[bytes] = field(default_factory=list)
    responses: list[bytes] = field(default_factory=list)


class TcpRelay:
    """Listens on a free loopback port and relays every connection to `upstream`; subclasses see each chunk
    (`_chunk`) before it is forwarded."""

    def __init__(self, upstream: tuple[str, int], port: int = 0) -> None:
        self.upstream = upstream
        self.sock = socket.create_server(("127.0.0.1", port))
        self.port = self.sock.getsockname()[1]
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _connection(self) -> Any:
        """Per-connection state handed to `_chunk`."""
        return None

    def _chunk(self, state: Any, data: bytes, toward_server: bool) -> None:
        """Called with every chunk before it is forwarded."""

    def _accept(self) -> None:
        self.sock.settimeout(0.2)
        while not self._stop.is_set():
            try:
                client, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.upstream, timeout=10)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._stop.is_set():  # closed while connecting: `close` has closed the others already
                    client.close()
                    upstream.close()
                    return
                self._sockets += [client, upstream]
                state = self._connection()
            for src, dst, toward_server in ((client, upstream, True), (upstream, client, False)):
                threading.Thread(target=self._pump, args=(src, dst, state, toward_server), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, state: Any, toward_server: bool) -> None:
        src.settimeout(None)
        try:
            while not self._stop.is_set():
                data = src.recv(1 << 16)
                if not data:
                    break
                self._chunk(state, data, toward_server)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        with self._lock:  # a connection accepted from now on is closed by the accepting thread itself
            self._stop.set()
        self.sock.close()
        self._thread.join(2)
        with self._lock:
            for s in self._sockets:
                s.close()


class RecordingRelay(TcpRelay):
    """Relays every connection to `upstream`, recording the whole Kafka frames both ways."""

    def __init__(self, upstream: tuple[str, int], port: int = 0) -> None:
        self.captures: list[Capture] = []
        super().__init__(upstream, port)

    def _connection(self) -> dict[bool, tuple[FrameBuffer, list[bytes]]]:
        cap = Capture(len(self.captures))
        self.captures.append(cap)
        return {True: (FrameBuffer(), cap.requests), False: (FrameBuffer(), cap.responses)}

    def _chunk(self, state: dict[bool, tuple[FrameBuffer, list[bytes]]], data: bytes, toward_server: bool) -> None:
        fb, frames = state[toward_server]
        fb.feed(data)
        while (frame := fb.next_frame()) is not None:
            frames.append(bytes(frame))


class DelayRelay(TcpRelay):
    """Holds every chunk toward the server for `delay` seconds (S3 latency injection in front of moto); the delay
    is read per chunk, so a test may lift it."""

    def __init__(self, upstream_port: int, delay: float) -> None:
        self.delay = delay
        super().__init__(("127.0.0.1", upstream_port))

    def _chunk(self, state: Any, data: bytes, toward_server: bool) -> None:
        if toward_server and self.delay:
            time.sleep(self.delay)


class CountingRelay(DelayRelay):
    """A loopback relay in front of an S3 server counting the requests it carries, by HTTP method."""

    def __init__(self, upstream_port: int) -> None:
        self.requests: dict[str, int] = {}
        self._count_lock = threading.Lock()
        super().__init__(upstream_port, 0.0)

    def _chunk(self, state: Any, data: bytes, toward_server: bool) -> None:
        if toward_server:
            method = data[:7].split(b" ", 1)[0]
            if method in (b"GET", b"PUT", b"POST", b"DELETE", b"HEAD"):
                with self._count_lock:
                    self.requests[method.decode()] = self.requests.get(method.decode(), 0) + 1
        super()._chunk(state, data, toward_server)
