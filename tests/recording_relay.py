"""A recording TCP relay for tests: forwards bytes both ways and records every whole Kafka frame it carries."""

from __future__ import annotations

import contextlib
import socket
import threading
from dataclasses import dataclass, field

from protocol.framing import FrameBuffer


@dataclass
class Capture:
    """One relayed connection: request frames (client → broker) and response frames (broker → client)."""

    conn_id: int
    requests: list[bytes] = field(default_factory=list)
    responses: list[bytes] = field(default_factory=list)


class RecordingRelay:
    """Listens on a free loopback port and relays every connection to `upstream`, recording frames."""

    def __init__(self, upstream: tuple[str, int], port: int = 0) -> None:
        self.upstream = upstream
        self.sock = socket.create_server(("127.0.0.1", port))
        self.port = self.sock.getsockname()[1]
        self.captures: list[Capture] = []
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

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
                self._sockets += [client, upstream]
                cap = Capture(len(self.captures))
                self.captures.append(cap)
            for src, dst, frames in ((client, upstream, cap.requests), (upstream, client, cap.responses)):
                threading.Thread(target=self._pump, args=(src, dst, frames), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, frames: list[bytes]) -> None:
        fb = FrameBuffer()
        src.settimeout(None)
        try:
            while True:
                data = src.recv(1 << 16)
                if not data:
                    break
                dst.sendall(data)
                fb.feed(data)
                while (frame := fb.next_frame()) is not None:
                    frames.append(bytes(frame))
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
            src.close()  # each socket is the source of exactly one pump

    def close(self) -> None:
        self._stop.set()
        self.sock.close()
        self._thread.join(2)
        with self._lock:
            for s in self._sockets:
                s.close()
