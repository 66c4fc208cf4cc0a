"""A file tier's answer as a region of the segment file, sent with sendfile: the batches are found by their headers
alone, the records never enter the process (as the broker serves its own log: `FileRecords.slice`).

What is checked without the records: every batch header read (magic 2, a length that fits the segment), so an
answer is whole batches from the one holding the wanted offset, in the segment's order. Given the segment's offset
index (its entries are batch starts, one per 4 KiB of log), the headers between the answer's first batch and the
last index entry that fits are not read (the index the tier wrote from those batches is trusted for where they
start; a position that is no batch start fails its header check): an answer of 4 MiB in 16 KiB batches reads 3-4
headers, not 256. What is not checked: the batches' CRCs — the client checks them (`check.crcs`), as it does for
the broker's own log; S3 reads, and a file tier with `remote.fetch.file.sendfile=false`, still check each batch's
CRC on every serve.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Sequence
from dataclasses import dataclass

from protocol.primitives import FileRegion
from protocol.records import BATCH_HEADER, HEADER_SIZE, LENGTH_OVERHEAD, TRANSACTIONAL_BIT

SMALL_BATCH = 4096  # after a batch smaller than this, the next header read takes a block (small batches come in runs)
BLOCK = 64 * 1024


class SegmentFile:
    """An open segment log file; closed when the last region of it is gone (sent, or its answer dropped)."""

    __slots__ = ("fd",)

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)

    def __del__(self) -> None:
        os.close(self.fd)


class BadHeader(ValueError):
    """A batch header that cannot be true (magic, length): the segment's bytes are not served."""


class OlderFormat(ValueError):
    """A batch of message format v0/v1 (magic 0 or 1), whose header says less: such an answer is read as bytes."""


class ShortFile(ValueError):
    """The file is shorter than its metadata says: nothing of it is served (a region past its end could not be
    sent whole)."""


@dataclass
class Walked:
    """What the headers say of an answer: its region, where its batches lie, what they hold."""

    region: FileRegion | None  # None: no batch at or after the offset fits
    last_offset: int = -1  # of the last batch in the region
    first_offset: int = -1  # base offset of the first batch in the region
    transactional: bool = False  # any batch of the region whose header was read is (all of them without `starts`)
    headers: int = 0  # batch headers read
    past_end: bool = False  # no batch at or after the offset in the whole segment (a compacted log's tail)


class _Headers:
    """Batch headers read from a file with as few reads as the batch sizes allow."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buf = b""
        self.at = 0

    def header(self, pos: int, wide: bool) -> tuple[int, ...] | None:
        rel = pos - self.at
        if rel < 0 or rel + HEADER_SIZE > len(self.buf):
            self.buf, self.at, rel = os.pread(self.fd, BLOCK if wide else HEADER_SIZE, pos), pos, 0
            if len(self.buf) < HEADER_SIZE:
                return None
        return BATCH_HEADER.unpack_from(self.buf, rel)


def _index_jump(starts: Sequence[int], headers: _Headers, pos: int, limit: int, size: int) -> int:
    """Where the walk from `pos` (a batch start) can go on without reading the headers between: the last batch start
    the offset index names ≤ `limit` if its batch fits below `limit`, else the one before it (the walk from there
    reads the batch that does not fit, so the region's last offset is known); `pos` when the index names none."""
    j = bisect.bisect_right(starts, limit) - 1
    if j < 0 or starts[j] <= pos:
        return pos
    h = headers.header(starts[j], False)
    if h is not None and starts[j] + h[1] + LENGTH_OVERHEAD <= min(limit, size):
        return starts[j]
    return starts[j - 1] if j >= 1 and starts[j - 1] > pos else pos


def walk(path: str, size: int, pos: int, offset: int, max_bytes: int, min_one: bool,
         starts: Sequence[int] | None = None) -> Walked:
    """From byte `pos` (a batch start at or before the batch holding `offset`) of a segment file of `size` bytes:
    the whole batches from the one holding `offset`, up to `max_bytes` (at least one when `min_one`), as a region
    whose owner keeps the file open until the region is gone. Blocking, but small: a read per batch header (a
    block after small batches) — with `starts` (the offset index's batch positions, ascending) only those around
    the first batch and the answer's end. Raises BadHeader for a header that cannot be true, OlderFormat,
    ShortFile, OSError for the file."""
    f = SegmentFile(path)
    found = os.fstat(f.fd).st_size
    if found < size:
        raise ShortFile(f"{path}: {found} bytes, its metadata says {size}")
    headers = _Headers(f.fd)
    first = end = -1
    out = Walked(None)
    last_size = SMALL_BATCH
    jumped = False
    while pos + HEADER_SIZE <= size:
        h = headers.header(pos, last_size < SMALL_BATCH)
        out.headers += 1
        if h is None:
            raise BadHeader(f"the file ends before the batch header at position {pos} ({size} bytes expected)")
        base, length, _, magic, _, attributes, last_delta = h[:7]
        if magic in (0, 1):
            raise OlderFormat(f"message format v{magic} at position {pos}")
        batch = length + LENGTH_OVERHEAD
        if magic != 2 or length < HEADER_SIZE - LENGTH_OVERHEAD or pos + batch > size:
            raise BadHeader(f"batch header at position {pos}: magic {magic}, length {length} in a segment of "
                            f"{size} bytes")
        last_size = batch
        if base + last_delta >= offset:
            if (end - first + batch > max_bytes) if first >= 0 else (batch > max_bytes and not min_one):
                break
            if first < 0:
                first, out.first_offset = pos, base
            end, out.last_offset = pos + batch, base + last_delta
            out.transactional = out.transactional or bool(attributes & TRANSACTIONAL_BIT)
            if end - first >= max_bytes:
                break
            if starts is not None and not jumped:  # every batch up to an index entry that fits is whole
                jumped = True
                landing = _index_jump(starts, headers, end, first + max_bytes, size)
                if landing > end:
                    pos = end = landing
                    continue
        pos += batch
    if first >= 0:
        out.region = FileRegion(f.fd, first, end - first, f)
    else:
        out.past_end = pos + HEADER_SIZE > size  # walked to the end, not stopped by a batch too big
    return out
