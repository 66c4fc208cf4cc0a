"""The compaction engine's compiled kernel (`tier.compaction.kernel.RecordKernel` over `compaction_loops`): what
the tier job passes to `clean_partition` when numba imports (`best_kernel`).

Per batch the Python left is the header (already unpacked by the engine), a view of the records section (the
segment's own buffer when uncompressed, no copy; decompressed by cramjam otherwise), one loop call, and for a
partly kept batch the codec, header and CRC (`protocol.records.finish_rebuilt`, shared with the Python path). The
key map's table is the OffsetMap's own `bytearray`, viewed by numpy: `map_bytes` is still all the map takes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from protocol import compression
from protocol.errors import ProtocolError
from protocol.records import (
    DELETE_HORIZON_BIT,
    HEADER_SIZE,
    LENGTH_OVERHEAD,
    TIMESTAMP_TYPE_BIT,
    BatchHeader,
    RecordBatch,
    finish_rebuilt,
)
from tierproxy.jobs.tiering import compaction_loops as loops
from tierproxy.tier.compaction.kernel import check_base_offset
from tierproxy.tier.compaction.offset_map import OffsetMap

_MAX_HEAD = 21  # a rebuilt record's length varint (5), attributes (1), timestamp delta (10), offset delta (5)


def _raise(code: int, base_offset: int) -> None:
    """The Python path's error for a loop's error code."""
    if code == loops.MAP_FULL:
        raise ValueError("the key map is full")
    raise ProtocolError({loops.TRUNCATED: f"batch at {base_offset}: truncated record",
                         loops.PAST_BATCH: "record length runs past the batch",
                         loops.LONG_VARINT: "varint longer than 10 bytes or past 64 bits",
                         loops.KEY_PAST: f"batch at {base_offset}: a key runs past its record",
                         loops.DELTA_PAST_INT: f"batch at {base_offset}: an offset delta past a 32-bit int"}[code])


class _Retained:
    __slots__ = ("count", "data", "kept", "pos", "stop", "tombstones", "total")

    def __init__(self, data: Any, pos: int, stop: int, count: int, kept: int, tombstones: bool) -> None:
        self.data, self.pos, self.stop, self.count = data, pos, stop, count
        self.total, self.kept, self.tombstones = count, kept, tombstones


class CompiledKernel:
    """The per-record loops compiled; scratch arrays reused from batch to batch (grown to the largest batch)."""

    def __init__(self) -> None:
        self._spans = np.zeros((256, 7), dtype=np.int64)
        self._keep = np.zeros(256, dtype=np.uint8)
        self._tail = np.zeros(128, dtype=np.uint8)
        self._digest = np.zeros(16, dtype=np.uint8)
        self._buf: Any = None  # the segment buffer last viewed, and its view
        self._view: Any = None

    def _section(self, batch: RecordBatch, h: BatchHeader) -> tuple[Any, int, int, int]:
        """(array, start, stop) of the records section, and its record count (scratch grown for it)."""
        check_base_offset(h)
        start, stop = batch.pos + HEADER_SIZE, batch.pos + h.batch_length + LENGTH_OVERHEAD
        codec = h.attributes & 0x07
        if codec == compression.NONE:
            if batch.buf is not self._buf:
                self._buf, self._view = batch.buf, np.frombuffer(batch.buf, dtype=np.uint8)
            data = self._view
        else:
            data = np.frombuffer(compression.decompress(codec, batch.buf[start:stop]), dtype=np.uint8)
            start, stop = 0, len(data)
        count = max(h.records_count, 0)
        if count > stop - start:  # each record takes a byte at least: the loop would run out of bytes
            _raise(loops.TRUNCATED, h.base_offset)
        if count > len(self._keep):
            self._spans = np.zeros((count, 7), dtype=np.int64)
            self._keep = np.zeros(count, dtype=np.uint8)
        return data, start, stop, count

    def map_batch(self, batch: RecordBatch, h: BatchHeader, start: int, offsets: OffsetMap) -> int:
        data, pos, stop, count = self._section(batch, h)
        err, keyed, added = loops.map_batch(data, pos, stop, count, h.base_offset, start,
                                            np.frombuffer(offsets.table, dtype=np.uint8), offsets.slots,
                                            offsets.entries, offsets.max_entries, self._spans, self._tail,
                                            self._digest)
        if err != loops.OK:
            _raise(err, h.base_offset)
        offsets.entries += added
        return int(keyed)

    def retain(self, batch: RecordBatch, h: BatchHeader, offsets: OffsetMap, now_ms: int) -> _Retained:
        data, pos, stop, count = self._section(batch, h)
        kept, tombstones = loops.retain(data, pos, stop, count, h.base_offset, h.base_timestamp,
                                        bool(h.attributes & DELETE_HORIZON_BIT), now_ms, offsets.latest_offset,
                                        np.frombuffer(offsets.table, dtype=np.uint8), offsets.slots, self._spans,
                                        self._tail, self._digest, self._keep)
        if kept < 0:
            _raise(kept, h.base_offset)
        return _Retained(data, pos, stop, count, int(kept), bool(tombstones))

    def rebuild(self, h: BatchHeader, retained: Any, delete_horizon_ms: int) -> bytes:
        # the spans and keep scratch still hold this batch's: the engine rebuilds a batch right after its retain
        out = np.empty(retained.stop - retained.pos + _MAX_HEAD * retained.count, dtype=np.uint8)
        n, base_ts, max_ts = loops.rebuild(retained.data, retained.pos, retained.count, self._spans, self._keep,
                                           bool(h.attributes & TIMESTAMP_TYPE_BIT), h.base_timestamp,
                                           h.max_timestamp, delete_horizon_ms, out)
        return finish_rebuilt(h, out[:n].data, retained.kept, int(base_ts), int(max_ts), delete_horizon_ms)

