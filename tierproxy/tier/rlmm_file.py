"""File-based RLMM for single-node development and unit tests: one append-only record file.

    file => [key_length:int32 key value_length:int32 (-1 = tombstone) value]*
Appends take an exclusive flock, so `serve` and `tier` on one machine can share a file; readers apply whatever
was appended since their last read.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import struct
from pathlib import Path
from typing import Any

from tierproxy.tier.rlmm import RemoteLogMetadataManager, WriterFenced

# key_length:int32 value_length:int32 (-1 = tombstone)
LENGTHS = struct.Struct(">ii")


class FileRLMM(RemoteLogMetadataManager):
    def __init__(self, directory: Path, writer: bool = False) -> None:
        """`writer`: the tier job's view; it holds `writer.lock` in the directory while open, so a second job
        refuses to start (WriterFenced) instead of copying the same ranges."""
        super().__init__()
        self.path = directory / "remote_log_metadata.records"
        self.writer = writer
        self._pos = 0
        self._lock = asyncio.Lock()
        self._writer_lock: Any = None

    async def start(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.touch(exist_ok=True)
        if self.writer:
            f = open(self.path.parent / "writer.lock", "a+")  # noqa: SIM115 - held until close()
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                f.close()
                raise WriterFenced(f"another tier job holds {self.path.parent / 'writer.lock'}") from None
            self._writer_lock = f
        await self.catch_up()

    async def close(self) -> None:
        if self._writer_lock is not None:
            self._writer_lock.close()  # releases the lock
            self._writer_lock = None

    async def publish(self, records: list[tuple[bytes, bytes | None]]) -> None:
        data = b"".join(LENGTHS.pack(len(k), -1 if v is None else len(v)) + k + (v or b"") for k, v in records)
        async with self._lock:
            with open(self.path, "ab") as f:
                fcntl.flock(f, fcntl.LOCK_EX)
                try:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                finally:
                    fcntl.flock(f, fcntl.LOCK_UN)
            self._read_new()

    def lag_records(self) -> int:
        """Whole records appended to the file since this view last read it."""
        with open(self.path, "rb") as f:
            f.seek(self._pos)
            data = f.read()
        n = pos = 0
        while len(data) - pos >= LENGTHS.size:
            klen, vlen = LENGTHS.unpack_from(data, pos)
            pos += LENGTHS.size + klen + max(vlen, 0)
            n += pos <= len(data)
        return n

    async def catch_up(self) -> None:
        async with self._lock:
            self._read_new()

    def _read_new(self) -> None:
        with open(self.path, "rb") as f:
            f.seek(self._pos)
            data = f.read()
        pos = 0
        while len(data) - pos >= LENGTHS.size:
            klen, vlen = LENGTHS.unpack_from(data, pos)
            end = pos + LENGTHS.size + klen + max(vlen, 0)
            if end > len(data):
                break  # a record still being appended
            key = data[pos + LENGTHS.size:pos + LENGTHS.size + klen]
            value = None if vlen < 0 else data[pos + LENGTHS.size + klen:end]
            self.apply_record(key, value)
            pos = end
        self._pos += pos
