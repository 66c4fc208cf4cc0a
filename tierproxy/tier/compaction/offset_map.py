"""Kafka's SkimpyOffsetMap: key → latest offset in a fixed table of `map_bytes`, whatever the key count.

    slot => md5(key):16 bytes offset:int64   (24 bytes a slot; an all-zero hash is an empty slot)

The probe sequence is Kafka's: the 4-byte big-endian int at hash[min(attempt, 12)], plus (attempt - 12) once past
the hash's end, abs'd and taken modulo the slot count. Two keys with one MD5 share an entry, as in Kafka.
"""

from __future__ import annotations

import hashlib
import struct

HASH_SIZE = 16
BYTES_PER_ENTRY = HASH_SIZE + 8
LOAD_FACTOR = 0.9  # log.cleaner.io.buffer.load.factor: the map is full at this share of its slots
_INT = struct.Struct(">i")
_LONG = struct.Struct(">q")
_EMPTY = bytes(HASH_SIZE)


class OffsetMap:
    """A bounded key → offset map (Kafka's `SkimpyOffsetMap` with MD5), plus the latest offset it covers."""

    __slots__ = ("entries", "latest_offset", "max_entries", "slots", "table")

    def __init__(self, map_bytes: int) -> None:
        self.slots = map_bytes // BYTES_PER_ENTRY
        if int(self.slots * LOAD_FACTOR) < 1:
            raise ValueError(f"map_bytes={map_bytes}: the key map holds no key; it needs at least "
                             f"{BYTES_PER_ENTRY * 2} bytes")
        self.table = bytearray(self.slots * BYTES_PER_ENTRY)
        self.entries = 0
        self.latest_offset = -1
        self.max_entries = int(self.slots * LOAD_FACTOR)  # Kafka's maxDesiredMapSize

    def clear(self) -> None:
        """Empty the map (Kafka's `clear`), never holding two tables at once."""
        size = len(self.table)
        self.table = bytearray()  # the old table goes before the new one is made: never twice map_bytes
        self.table = bytearray(size)
        self.entries = 0
        self.latest_offset = -1

    @property
    def full(self) -> bool:
        return self.entries >= self.max_entries

    def _position(self, digest: bytes, attempt: int) -> int:
        probe = _INT.unpack_from(digest, min(attempt, HASH_SIZE - 4))[0] + max(0, attempt - HASH_SIZE + 4)
        probe = (probe + 2**31) % 2**32 - 2**31  # Java int arithmetic
        return (0 if probe == -2**31 else abs(probe)) % self.slots * BYTES_PER_ENTRY

    def _first_position(self, digest: bytes) -> int:
        # attempt 0: the hash's first four bytes as a Java int (never -2**31 after abs: 2**31 % slots as Java)
        probe = int.from_bytes(digest[:4], "big", signed=True)
        return (0 if probe == -2**31 else abs(probe)) % self.slots * BYTES_PER_ENTRY

    def put(self, key: bytes | memoryview, offset: int) -> None:
        digest = hashlib.md5(key).digest()
        table = self.table
        attempt = 0
        pos = self._first_position(digest)
        found = table[pos:pos + HASH_SIZE]
        while found != _EMPTY:
            if found == digest:
                _LONG.pack_into(table, pos + HASH_SIZE, offset)
                self.latest_offset = offset
                return
            attempt += 1
            pos = self._position(digest, attempt)
            found = table[pos:pos + HASH_SIZE]
        if self.entries >= self.slots:
            raise ValueError(f"the key map is full ({self.entries} keys)")
        table[pos:pos + HASH_SIZE] = digest
        _LONG.pack_into(table, pos + HASH_SIZE, offset)
        self.latest_offset = offset
        self.entries += 1

    def get(self, key: bytes | memoryview) -> int:
        """The offset stored for `key`, or -1."""
        digest = hashlib.md5(key).digest()
        table = self.table
        for attempt in range(self.slots + HASH_SIZE - 4):
            pos = self._position(digest, attempt) if attempt else self._first_position(digest)
            found = table[pos:pos + HASH_SIZE]
            if found == _EMPTY:
                return -1
            if found == digest:
                return int(_LONG.unpack_from(table, pos + HASH_SIZE)[0])
        return -1
