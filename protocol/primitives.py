"""Kafka primitive types over a `memoryview` (reading) and a chunk list (writing).

Grammar (big-endian unless noted; see the Kafka protocol guide):
    int8/int16/int32/int64/uint16/uint32/float64  fixed width
    varint / varlong        zigzag-encoded, 7 bits per byte, low groups first
    unsigned_varint         7 bits per byte, low groups first, no zigzag
    uuid                    16 bytes
    string / nullable       int16 length (-1 = null) + UTF-8
    compact string          unsigned_varint (length + 1, 0 = null) + UTF-8
    bytes / records         int32 length (-1 = null) + data
    compact bytes/records   unsigned_varint (length + 1, 0 = null) + data
    array                   int32 count (-1 = null) + items
    compact array           unsigned_varint (count + 1, 0 = null) + items
    tagged fields           unsigned_varint count, then per field: unsigned_varint tag, unsigned_varint size, data
Reads never copy record data: `bytes_view` returns a slice of the underlying memoryview.
"""

from __future__ import annotations

import struct
from typing import NoReturn

from protocol.errors import ProtocolError

INT8 = struct.Struct(">b")
INT16 = struct.Struct(">h")
UINT16 = struct.Struct(">H")
INT32 = struct.Struct(">i")
UINT32 = struct.Struct(">I")
INT64 = struct.Struct(">q")
FLOAT64 = struct.Struct(">d")


class Reader:
    """A cursor over a memoryview; every read past the end raises `ProtocolError`."""

    __slots__ = ("buf", "end", "pos")

    def __init__(self, buf: memoryview, pos: int = 0, end: int | None = None) -> None:
        self.buf = buf
        self.pos = pos
        self.end = len(buf) if end is None else end

    def _need(self, n: int) -> int:
        p = self.pos
        if n < 0 or p + n > self.end:
            raise ProtocolError(f"truncated: need {n} bytes at {p}, have {self.end - p}")
        self.pos = p + n
        return p

    def remaining(self) -> int:
        return self.end - self.pos

    def int8(self) -> int:
        return int(INT8.unpack_from(self.buf, self._need(1))[0])

    def int16(self) -> int:
        return int(INT16.unpack_from(self.buf, self._need(2))[0])

    def uint16(self) -> int:
        return int(UINT16.unpack_from(self.buf, self._need(2))[0])

    def int32(self) -> int:
        return int(INT32.unpack_from(self.buf, self._need(4))[0])

    def uint32(self) -> int:
        return int(UINT32.unpack_from(self.buf, self._need(4))[0])

    def int64(self) -> int:
        return int(INT64.unpack_from(self.buf, self._need(8))[0])

    def float64(self) -> float:
        return float(FLOAT64.unpack_from(self.buf, self._need(8))[0])

    def boolean(self) -> bool:
        v = self.int8()
        if v not in (0, 1):
            raise ProtocolError(f"bad boolean {v}")
        return v == 1

    def uuid(self) -> bytes:
        p = self._need(16)
        return bytes(self.buf[p:p + 16])

    def unsigned_varint(self) -> int:
        buf, p, end = self.buf, self.pos, self.end
        value = shift = 0
        while True:
            if p >= end:
                raise ProtocolError("truncated varint")
            b = buf[p]
            p += 1
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                break
            shift += 7
            if shift > 63:
                raise ProtocolError("varint too long")
        self.pos = p
        return value

    def varint(self) -> int:
        v = self.unsigned_varint()
        if v > 0xFFFFFFFF:
            raise ProtocolError("varint out of range")
        return (v >> 1) ^ -(v & 1)

    def varlong(self) -> int:
        v = self.unsigned_varint()
        return (v >> 1) ^ -(v & 1)

    def view(self, n: int) -> memoryview:
        p = self._need(n)
        return self.buf[p:p + n]

    def _text(self, n: int) -> str:
        p = self._need(n)
        try:
            return str(self.buf[p:p + n], "utf-8")
        except UnicodeDecodeError as exc:
            raise ProtocolError(f"invalid UTF-8 string: {exc.reason}") from None

    def string(self) -> str:
        n = self.int16()
        if n < 0:
            raise ProtocolError("null in non-nullable string")
        return self._text(n)

    def nullable_string(self) -> str | None:
        n = self.int16()
        if n < -1:
            _bad_len(n)
        return None if n == -1 else self._text(n)

    def compact_string(self) -> str:
        n = self.unsigned_varint() - 1
        if n < 0:
            raise ProtocolError("null in non-nullable compact string")
        return self._text(n)

    def compact_nullable_string(self) -> str | None:
        n = self.unsigned_varint() - 1
        return None if n < 0 else self._text(n)

    def bytes_view(self) -> memoryview:
        n = self.int32()
        if n < 0:
            raise ProtocolError("null in non-nullable bytes")
        return self.view(n)

    def nullable_bytes_view(self) -> memoryview | None:
        n = self.int32()
        if n < -1:
            _bad_len(n)
        return None if n == -1 else self.view(n)

    def compact_bytes_view(self) -> memoryview:
        n = self.unsigned_varint() - 1
        if n < 0:
            raise ProtocolError("null in non-nullable compact bytes")
        return self.view(n)

    def compact_nullable_bytes_view(self) -> memoryview | None:
        n = self.unsigned_varint() - 1
        return None if n < 0 else self.view(n)

    def array_len(self) -> int:
        n = self.int32()
        if n < -1:
            _bad_len(n)
        if n > self.remaining():  # every item takes at least one byte: stop absurd counts early
            raise ProtocolError(f"array count {n} exceeds the {self.remaining()} bytes left")
        return n

    def compact_array_len(self) -> int:
        n = self.unsigned_varint() - 1
        if n > self.remaining():
            raise ProtocolError(f"array count {n} exceeds the {self.remaining()} bytes left")
        return n


def _bad_len(n: int) -> NoReturn:
    raise ProtocolError(f"negative length {n}")


def zigzag(v: int) -> int:
    return (v << 1) ^ (v >> 63)


def encode_unsigned_varint(v: int) -> bytes:
    out = bytearray()
    while v > 0x7F:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def encode_varint(v: int) -> bytes:
    return encode_unsigned_varint(zigzag(v) & 0xFFFFFFFFFFFFFFFF)


class FileRegion:
    """A field's bytes the codec never holds: `length` bytes at `position` of the open file `fd`, sent by the
    transport itself (sendfile, as the broker sends its log). The codec writes the length prefix and passes the
    region on as its own chunk; `owner` is whatever keeps `fd` open until the bytes have left (no IO here)."""

    __slots__ = ("fd", "length", "owner", "position")

    def __init__(self, fd: int, position: int, length: int, owner: object = None) -> None:
        self.fd, self.position, self.length, self.owner = fd, position, length, owner

    def __len__(self) -> int:
        return self.length

    def __repr__(self) -> str:
        return f"FileRegion(fd={self.fd}, position={self.position}, length={self.length})"


Buffer = bytes | bytearray | memoryview
Chunk = Buffer | FileRegion


class RecordPieces:
    """A record set held as several buffers, in order: views of the cached chunks a record set straddles, which one
    contiguous copy would join. The codec writes the length prefix and passes each piece on as its own chunk; each
    piece holds whole batches (`parts`), so a reader can walk them one piece at a time."""

    __slots__ = ("length", "parts")

    def __init__(self, parts: list[memoryview]) -> None:
        self.parts = parts
        self.length = sum(len(p) for p in parts)

    def __len__(self) -> int:
        return self.length

    def __repr__(self) -> str:
        return f"RecordPieces({len(self.parts)} parts, length={self.length})"


def buffers(chunks: list[Chunk]) -> list[Buffer]:
    """The chunks as bytes-likes: ProtocolError for a file region (a message whose bytes must be in memory here)."""
    out: list[Buffer] = []
    for c in chunks:
        if isinstance(c, FileRegion):
            raise ProtocolError(f"{c!r} where the bytes themselves are needed")
        out.append(c)
    return out


class Writer:
    """Accumulates encoded bytes; record sets are appended as separate chunks so they are never copied."""

    __slots__ = ("buf", "chunks")

    def __init__(self) -> None:
        self.buf = bytearray()
        self.chunks: list[Chunk] = []

    def int8(self, v: int) -> None:
        self.buf += INT8.pack(v)

    def int16(self, v: int) -> None:
        self.buf += INT16.pack(v)

    def uint16(self, v: int) -> None:
        self.buf += UINT16.pack(v)

    def int32(self, v: int) -> None:
        self.buf += INT32.pack(v)

    def uint32(self, v: int) -> None:
        self.buf += UINT32.pack(v)

    def int64(self, v: int) -> None:
        self.buf += INT64.pack(v)

    def float64(self, v: float) -> None:
        self.buf += FLOAT64.pack(v)

    def boolean(self, v: bool) -> None:
        self.buf.append(1 if v else 0)

    def uuid(self, v: bytes) -> None:
        if len(v) != 16:
            raise ProtocolError(f"uuid must be 16 bytes, got {len(v)}")
        self.buf += v

    def unsigned_varint(self, v: int) -> None:
        buf = self.buf
        while v > 0x7F:
            buf.append((v & 0x7F) | 0x80)
            v >>= 7
        buf.append(v)

    def varint(self, v: int) -> None:
        self.unsigned_varint(zigzag(v) & 0xFFFFFFFF)

    def varlong(self, v: int) -> None:
        self.unsigned_varint(zigzag(v) & 0xFFFFFFFFFFFFFFFF)

    def raw(self, data: bytes | bytearray | memoryview) -> None:
        self.buf += data

    def string(self, v: str | None, compact: bool) -> None:
        if v is None:
            if compact:
                self.unsigned_varint(0)
            else:
                self.int16(-1)
            return
        data = v.encode()
        if compact:
            self.unsigned_varint(len(data) + 1)
        else:
            self.int16(len(data))
        self.buf += data

    def bytes_(self, v: bytes | bytearray | memoryview | FileRegion | RecordPieces | None, compact: bool,
               zero_copy: bool = False) -> None:
        if v is None:
            if compact:
                self.unsigned_varint(0)
            else:
                self.int32(-1)
            return
        if compact:
            self.unsigned_varint(len(v) + 1)
        else:
            self.int32(len(v))
        if isinstance(v, FileRegion):
            if not zero_copy:
                raise ProtocolError("a file region can only stand for a record set")
            self.chunks.append(self.buf)
            self.chunks.append(v)
            self.buf = bytearray()
        elif isinstance(v, RecordPieces):
            if zero_copy:
                self.chunks.append(self.buf)
                self.chunks.extend(v.parts)
                self.buf = bytearray()
            else:
                for part in v.parts:
                    self.buf += part
        elif zero_copy and len(v) > 256:
            self.chunks.append(self.buf)
            self.chunks.append(v)
            self.buf = bytearray()
        else:
            self.buf += v

    def array_len(self, n: int | None, compact: bool) -> None:
        if compact:
            self.unsigned_varint(0 if n is None else n + 1)
        else:
            self.int32(-1 if n is None else n)

    def finish(self) -> list[Chunk]:
        """The encoded output as chunks (record sets as their own, uncopied chunks)."""
        if self.buf:
            self.chunks.append(self.buf)
            self.buf = bytearray()
        return self.chunks
