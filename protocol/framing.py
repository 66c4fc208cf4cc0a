"""Size-prefixed framing: bytes in, whole frames out (sans-IO).

Wire grammar: frame => size:int32 payload[size]

One receive buffer per connection; frames are split off by advancing a read index, never by rescanning.
Small frames are copied out of the staging buffer (so they outlive it). A frame larger than half the staging
buffer gets a buffer of its own as soon as its size is known: the rest of it is received straight into that
buffer by `get_buffer`, and the frame is handed out as a memoryview of it — the record sets inside large
Fetch/Produce frames are not copied again on the way through. Where the sender's sizes are not trusted (a
client's requests), that buffer grows with the bytes that arrive (doubling, up to the announced size) instead of
being allocated to the announced size up front: memory follows what a peer sends, not what it claims. Such a
buffer is made and grown only by `get_buffer`, and `growth` tells beforehand how much the next call allocates, so a
caller bounding memory (`queued.max.request.bytes`) reserves it before the read, or stops reading.

The staging buffer itself starts small (4 KiB) and doubles up to its full size (64 KiB) when a read fills it or a
staged frame needs the room, as Netty's adaptive receive buffer does: a connection that sent a few small requests
and sits idle (most of a proxy's thousand) holds 4 KiB a side, not 64; a busy one reaches the full size in a few
reads. Which frames get a buffer of their own depends on the full size only, never on how far the buffer has grown.
"""

from __future__ import annotations

import contextlib
import struct

from protocol.errors import ProtocolError

# size:int32 — the length of the payload that follows
FRAME_SIZE = struct.Struct(">i")
DEFAULT_MAX_FRAME_SIZE = 100 * 1024 * 1024  # Kafka's socket.request.max.bytes default
DEFAULT_STAGING_SIZE = 64 * 1024
INITIAL_STAGING_SIZE = 4 * 1024  # what a connection's staging buffer starts with (it grows to the staging size)
HEAD = FRAME_SIZE.size  # the size prefix in front of each frame handed out by `next_wire`


class FrameBuffer:
    """Feed bytes (or receive into `get_buffer`), then take frames with `next_frame` until it returns None."""

    __slots__ = ("_big", "_big_size", "_big_w", "_buf", "_filled", "_into_big", "_max", "_r", "_size", "_staging",
                 "_trusted", "_w")

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE, staging_size: int = DEFAULT_STAGING_SIZE,
                 trusted_sizes: bool = True) -> None:
        self._max = max_frame_size
        self._trusted = trusted_sizes  # False: a large frame's buffer grows as its bytes arrive
        self._staging = staging_size  # the staging buffer's full size; frames over half of it get their own
        self._buf = bytearray(min(staging_size, INITIAL_STAGING_SIZE))
        self._filled = False  # the last read filled the staging buffer: the peer sends more than it holds
        self._r = 0  # read index into _buf
        self._w = 0  # write index into _buf
        self._size = -1  # payload size of the frame at _r, once read
        self._big: bytearray | None = None  # dedicated buffer of a large frame in progress
        self._big_size = 0  # that frame's announced size (the buffer may still be smaller)
        self._big_w = 0
        self._into_big = False

    @property
    def max_frame_size(self) -> int:
        return self._max

    @max_frame_size.setter
    def max_frame_size(self, n: int) -> None:
        """Frames announced after this are checked against `n` (a connection's limit may change: SASL)."""
        self._max = n

    def buffered(self) -> int:
        """Bytes received but not yet handed out as frames."""
        return (self._w - self._r) + (self._big_w if self._big is not None else 0)

    def inside_large_frame(self) -> bool:
        """A large frame is being received and is not whole yet (no frame can be taken before it is)."""
        return self._big is not None and self._big_w < self._big_size

    def allocated(self) -> int:
        """Bytes this buffer holds in memory (staging buffer and a large frame's buffer)."""
        return len(self._buf) + (len(self._big) if self._big is not None else 0)

    def budgeted(self) -> int:
        """What this buffer counts against a memory budget: the staging buffer at its full size (however far it
        has grown: a budget's per-connection floor covers exactly that) and a large frame's buffer whole."""
        return max(self._staging, len(self._buf)) + (len(self._big) if self._big is not None else 0)

    def growth(self) -> int:
        """Bytes the next `get_buffer` allocates for a large frame (its buffer made, or grown by the bytes that
        arrived), 0 if none: what a caller bounding memory reserves before it lets the next read happen."""
        big = self._big
        if big is not None:
            room = len(big) - HEAD
            return min(room, self._big_size - room) if self._big_w < self._big_size and room == self._big_w else 0
        size, have = self._size, self._w - self._r
        if size < 0 and self._w == len(self._buf) and have >= HEAD:  # get_buffer reads the size first
            size, have = FRAME_SIZE.unpack_from(self._buf, self._r)[0], have - HEAD
            if size > self._max:
                return 0
        if size <= self._staging // 2 or have >= size:
            return 0
        return HEAD + (size if self._trusted else min(size, max(have, self._staging)))

    def get_buffer(self, sizehint: int = -1) -> memoryview:
        """A writable region for the next received bytes (asyncio.BufferedProtocol.get_buffer)."""
        big = self._big
        if big is None:
            if self._w == len(self._buf):
                # a large frame's header may be staged: the rest of that frame goes to its own buffer, not here
                with contextlib.suppress(ProtocolError):  # a bad size is raised by next_frame, not here
                    self._advance_header()
            if self._big is None and self._size > self._staging // 2 and self._w - self._r < self._size:
                self._start_large()  # an untrusted size's frame gets its buffer here, where `growth` counted it
            big = self._big
        if big is not None and self._big_w < self._big_size:
            if HEAD + self._big_w == len(big):  # untrusted sizes: grow with what arrived, up to the announced size
                big = self._grow(big)
            self._into_big = True
            return memoryview(big)[HEAD + self._big_w:]
        self._into_big = False
        if self._filled:  # the last read filled the buffer: the peer sends more than it holds, read more at once
            self._filled = False
            if len(self._buf) < self._staging:
                with contextlib.suppress(BufferError):  # a caller still holds a view of it: grow another time
                    self._buf.extend(bytes(len(self._buf)))
        if self._w == len(self._buf):
            self._compact()
            if self._w == len(self._buf):  # whole frames (or a staged one) need more room: make it rather than stall
                self._buf.extend(bytes(len(self._buf)))
        return memoryview(self._buf)[self._w:]

    def buffer_updated(self, n: int) -> None:
        """Record that `n` bytes were written into the region from `get_buffer`."""
        if self._into_big:
            self._big_w += n
        else:
            self._w += n
            self._filled = self._w == len(self._buf)

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Copy `data` in (for callers that are handed bytes, such as tests and non-buffered transports)."""
        view = memoryview(data).cast("B")
        while view:
            region = self.get_buffer(len(view))
            n = min(len(region), len(view))
            region[:n] = view[:n]
            region.release()  # the staging buffer may need to grow on the next turn
            self.buffer_updated(n)
            view = view[n:]

    def next_frame(self) -> memoryview | None:
        """The next whole frame payload (no size prefix), or None until more bytes arrive."""
        wire = self.next_wire()
        return None if wire is None else wire[HEAD:]

    def next_wire(self) -> memoryview | None:
        """The next whole frame as it came on the wire, size prefix included (what a relay writes back out in one
        piece, with no copy), or None until more bytes arrive."""
        big = self._big
        if big is not None:
            if self._big_w < self._big_size:
                return None
            self._big = None
            self._big_w = self._big_size = 0
            return memoryview(big)
        self._advance_header()
        if self._big is not None:
            return self.next_wire()
        size = self._size
        if size < 0 or self._w - self._r < size:
            return None
        start = self._r
        wire = self._buf[start - HEAD:start + size]  # one copy: small frames outlive the staging buffer
        self._r = start + size
        self._size = -1
        if self._r == self._w:
            self._r = self._w = 0
        return memoryview(wire)

    def _advance_header(self) -> None:
        if self._size >= 0 or self._w - self._r < 4:
            return
        size = FRAME_SIZE.unpack_from(self._buf, self._r)[0]
        if size < 0 or size > self._max:
            raise ProtocolError(f"frame size {size} outside 0..{self._max} (max frame size)")
        self._r += 4
        self._size = size
        if size > self._staging // 2 and self._trusted:
            self._start_large()  # untrusted: `get_buffer` does it, once the caller could reserve it (`growth`)

    def _start_large(self) -> None:
        """A large frame gets its own buffer so the rest of it lands there directly."""
        size = self._size
        have = self._w - self._r
        take = min(have, size)
        # HEAD bytes in front keep the size prefix: the frame goes back out as one piece (`next_wire`)
        big = bytearray(HEAD + (size if self._trusted else min(size, max(take, self._staging))))
        big[:HEAD + take] = memoryview(self._buf)[self._r - HEAD:self._r + take]
        self._r += take
        self._big, self._big_w, self._big_size = big, take, size
        self._size = -1
        if self._r == self._w:  # otherwise the frame was already whole and what follows stays staged
            self._r = self._w = 0

    def _grow(self, big: bytearray) -> bytearray:
        room = len(big) - HEAD
        more = bytes(min(room, self._big_size - room))
        try:
            big.extend(more)
        except BufferError:  # a caller still holds a view of it: move to a new buffer instead
            big = bytearray(big) + more
            self._big = big
        return big

    def _compact(self) -> None:
        keep = HEAD if self._size >= 0 else 0  # a frame whose size was read keeps its prefix in front of it
        src = self._r - keep
        if src <= 0:
            return
        pending = self._w - src
        self._buf[:pending] = self._buf[src:self._w]
        self._r, self._w = keep, pending


def frame_header(payload_size: int) -> bytes:
    """The 4-byte size prefix of a frame."""
    return FRAME_SIZE.pack(payload_size)
