"""Segment indexes in Kafka's on-disk formats, built from raw record batches without decoding records.

    offset index  => [relative_offset:int32 position:int32]   one entry per `index.interval.bytes` of log
    time index    => [timestamp:int64 relative_offset:int32]  same cadence, only when the max timestamp grows
    leader-epoch checkpoint => "0\\n<count>\\n<epoch> <start offset>\\n..." (Kafka's text checkpoint)
    txn index     => [version:int16 producer_id:int64 first_offset:int64 last_offset:int64
                      last_stable_offset:int64]   one per aborted transaction completed in the segment
    producer snapshot => version:int16(1) crc:uint32 [producer_id:int64 epoch:int16 last_sequence:int32
                      last_offset:int64 offset_delta:int32 timestamp:int64 coordinator_epoch:int32
                      current_txn_first_offset:int64]  — transactions still open at the segment's end, so the
                      next segment's txn index can name their first offset.
"""

from __future__ import annotations

import array
import bisect
import struct
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

import crc32c

from protocol.records import ABORT, RecordBatch, iter_batches

INDEX_INTERVAL_BYTES = 4096
# relative_offset:int32 position:int32
OFFSET_ENTRY = struct.Struct(">ii")
# timestamp:int64 relative_offset:int32
TIME_ENTRY = struct.Struct(">qi")
# version:int16 producer_id:int64 first_offset:int64 last_offset:int64 last_stable_offset:int64
TXN_ENTRY = struct.Struct(">hqqqq")
# producer_id:int64 epoch:int16 last_sequence:int32 last_offset:int64 offset_delta:int32 timestamp:int64
# coordinator_epoch:int32 current_txn_first_offset:int64
PRODUCER_ENTRY = struct.Struct(">qhiqiqiq")
# version:int16 crc:uint32 ; then entries count:int32
SNAPSHOT_HEADER = struct.Struct(">hI")


@dataclass(slots=True)
class ProducerEntry:
    producer_id: int
    epoch: int
    last_sequence: int
    last_offset: int
    offset_delta: int
    timestamp: int
    coordinator_epoch: int
    current_txn_first_offset: int  # -1: no open transaction


@dataclass(slots=True)
class AbortedTxn:
    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int


@dataclass
class SegmentFiles:
    """What goes to remote storage for one segment, plus the facts its metadata needs.

    The log is kept as the batches' own buffers (`log_parts`), written out without joining them first."""

    log_parts: list[memoryview]
    offset_index: bytes
    time_index: bytes
    leader_epoch_checkpoint: bytes
    txn_index: bytes
    producer_snapshot: bytes
    start_offset: int
    end_offset: int
    max_timestamp_ms: int
    leader_epochs: dict[int, int]  # epoch → first offset in this segment
    aborted: list[AbortedTxn] = field(default_factory=list)
    producers: dict[int, ProducerEntry] = field(default_factory=dict)

    @property
    def txn_index_empty(self) -> bool:
        return not self.aborted

    @property
    def log_size(self) -> int:
        return sum(len(p) for p in self.log_parts)

    @property
    def log(self) -> bytes:
        """The whole log as one bytes object (a copy: for tests and small segments)."""
        return b"".join(self.log_parts)


class SegmentBuilder:
    """Feed whole batches in offset order; `finish()` returns the segment files and their facts.

    `producers` carries the producer state (open transactions) from the end of the previous segment.
    """

    def __init__(self, producers: dict[int, ProducerEntry] | None = None,
                 index_interval_bytes: int = INDEX_INTERVAL_BYTES,
                 txn_starts: list[tuple[int, int]] | None = None, base_offset: int | None = None) -> None:
        """`txn_starts` — (producer id, first offset) of aborted transactions as the broker reports them in
        READ_COMMITTED fetches — names the start of a transaction that began before this segment. `base_offset`:
        the segment's first offset when it lies below its first batch (a compacted log's, as a broker segment's
        base offset may): the indexes' relative offsets count from it. Default: the first batch's base offset."""
        self.base_offset = base_offset
        self.interval = index_interval_bytes
        self.log_parts: list[memoryview] = []
        self.log_size = 0
        self.offset_index = bytearray()
        self.time_index = bytearray()
        self.epochs: dict[int, int] = {}
        self.aborted: list[AbortedTxn] = []
        self.producers = {pid: ProducerEntry(**vars_of(e)) for pid, e in (producers or {}).items()}
        self.txn_starts = sorted(txn_starts or [])
        self._last_marker: dict[int, int] = {}  # producer id → offset of its latest marker in this segment
        self.start_offset = -1
        self.end_offset = -1
        self.max_ts = -1
        self._max_ts_offset = -1
        self._since_index = 0
        self._last_time_entry = -1

    def add(self, batch: RecordBatch) -> None:
        if batch.magic != 2:
            raise ValueError(f"batch at {batch.base_offset} has magic {batch.magic}: only v2 batches are tiered")
        if self.start_offset < 0:
            self.start_offset = batch.base_offset
            for pid, first in self.txn_starts:  # aborted transactions already open when this segment begins
                if first < batch.base_offset:
                    entry = self.producers.setdefault(pid, ProducerEntry(pid, -1, -1, -1, 0, -1, -1, -1))
                    entry.current_txn_first_offset = max(entry.current_txn_first_offset, first)
        elif batch.base_offset <= self.end_offset:
            raise ValueError(f"batch at {batch.base_offset} does not follow {self.end_offset}")
        position = self.log_size
        last = batch.last_offset
        base = self.start_offset if self.base_offset is None else self.base_offset
        if self._since_index > self.interval:
            self.offset_index += OFFSET_ENTRY.pack(last - base, position)
            if self.max_ts > self._last_time_entry:
                self.time_index += TIME_ENTRY.pack(self.max_ts, self._max_ts_offset - base)
                self._last_time_entry = self.max_ts
            self._since_index = 0
        self.log_parts.append(batch.view())
        self.log_size += batch.size
        self._since_index += batch.size
        self.end_offset = last
        if batch.max_timestamp > self.max_ts:
            self.max_ts, self._max_ts_offset = batch.max_timestamp, last
        epoch = batch.partition_leader_epoch
        if epoch >= 0 and (not self.epochs or epoch > max(self.epochs)):
            # the segment's first epoch holds from its base offset (the offsets a cleaner removed before the
            # first batch were written in it or earlier)
            self.epochs[epoch] = min(batch.base_offset, base) if not self.epochs else batch.base_offset
        self._track_producer(batch)

    def _track_producer(self, batch: RecordBatch) -> None:
        pid = batch.producer_id
        if pid < 0 or (batch.is_control and batch.records_count == 0):
            return  # an empty control batch: the cleaner removed its transaction whole (Kafka appends nothing)
        entry = self.producers.get(pid)
        if entry is None:
            entry = self.producers[pid] = ProducerEntry(pid, batch.producer_epoch, -1, -1, 0, -1, -1, -1)
        entry.epoch = batch.producer_epoch
        entry.last_offset = batch.last_offset
        entry.timestamp = batch.max_timestamp
        if batch.is_control:
            ctl = batch.control_record()
            entry.coordinator_epoch = ctl.coordinator_epoch
            first = entry.current_txn_first_offset
            # the broker's word wins for a transaction that began before this segment — but only one still open:
            # a hint at or before this producer's previous marker belongs to a transaction already closed
            closed = self._last_marker.get(pid, -1)
            starts = [o for p, o in self.txn_starts if p == pid and closed < o <= batch.base_offset]
            if starts and ctl.type == ABORT:
                first = max(starts)
            self._last_marker[pid] = batch.base_offset
            if ctl.type == ABORT and first >= 0:
                self.aborted.append(AbortedTxn(pid, first, batch.last_offset, self._lso_after(pid, batch.last_offset)))
            entry.current_txn_first_offset = -1
            return
        entry.last_sequence = batch.base_sequence + batch.last_offset_delta if batch.base_sequence >= 0 else -1
        entry.offset_delta = batch.last_offset_delta
        if batch.is_transactional and entry.current_txn_first_offset < 0:
            entry.current_txn_first_offset = batch.base_offset

    def _lso_after(self, done_pid: int, marker_offset: int) -> int:
        # the last stable offset once this transaction completed: the first offset still open elsewhere
        open_firsts = [e.current_txn_first_offset for p, e in self.producers.items()
                       if p != done_pid and e.current_txn_first_offset >= 0]
        return min(open_firsts) if open_firsts else marker_offset + 1

    def finish(self, end_offset: int | None = None) -> SegmentFiles:
        """The segment's files; `end_offset`: its last offset when above its last batch's (a compacted log's)."""
        if self.start_offset < 0:
            raise ValueError("an empty segment")
        if self.base_offset is not None:
            if self.base_offset > self.start_offset:
                raise ValueError(f"base offset {self.base_offset} above the first batch at {self.start_offset}")
            self.start_offset = self.base_offset
        if end_offset is not None:
            if end_offset < self.end_offset:
                raise ValueError(f"end offset {end_offset} below the last batch's {self.end_offset}")
            self.end_offset = end_offset
        return SegmentFiles(
            log_parts=list(self.log_parts), offset_index=bytes(self.offset_index), time_index=bytes(self.time_index),
            leader_epoch_checkpoint=encode_leader_epochs(self.epochs), txn_index=encode_txn_index(self.aborted),
            producer_snapshot=encode_producer_snapshot(self.producers), start_offset=self.start_offset,
            end_offset=self.end_offset, max_timestamp_ms=self.max_ts, leader_epochs=dict(self.epochs),
            aborted=list(self.aborted), producers={p: ProducerEntry(**vars_of(e)) for p, e in self.producers.items()})


def empty_segment(start_offset: int, end_offset: int, leader_epoch: int,
                  aborted: Sequence[tuple[int, int]] = ()) -> SegmentFiles:
    """A segment of no batches covering [start_offset, end_offset]: a range of a compacted log whose every record
    the cleaner removed. Its one leader epoch (`leader_epoch`: the next batch's, ≥ any removed record's) starts at
    its start. Its producer snapshot names the aborted transactions (producer id, first offset; as a READ_COMMITTED
    fetch lists them) still open at its end, so a reader following a transaction through it goes on to the
    segment holding its marker instead of taking it for committed."""
    producers = {pid: ProducerEntry(pid, -1, -1, -1, 0, -1, -1, first) for pid, first in sorted(aborted)
                 if first <= end_offset}
    epochs = {max(leader_epoch, 0): start_offset}
    return SegmentFiles(log_parts=[], offset_index=b"", time_index=b"", leader_epoch_checkpoint=encode_leader_epochs(
        epochs), txn_index=b"", producer_snapshot=encode_producer_snapshot(producers), start_offset=start_offset,
        end_offset=end_offset, max_timestamp_ms=-1, leader_epochs=epochs, producers=producers)


def vars_of(e: ProducerEntry) -> dict[str, int]:
    return {k: getattr(e, k) for k in ProducerEntry.__slots__}


def encode_leader_epochs(epochs: dict[int, int]) -> bytes:
    lines = ["0", str(len(epochs))] + [f"{e} {o}" for e, o in sorted(epochs.items(), key=lambda kv: kv[1])]
    return ("\n".join(lines) + "\n").encode()


def decode_leader_epochs(data: bytes) -> dict[int, int]:
    lines = data.decode().split("\n")
    if lines[0] != "0":
        raise ValueError(f"unknown leader-epoch checkpoint version {lines[0]!r}")
    n = int(lines[1])
    return {int(e): int(o) for e, o in (line.split() for line in lines[2:2 + n])}


def encode_txn_index(aborted: list[AbortedTxn]) -> bytes:
    return b"".join(TXN_ENTRY.pack(0, a.producer_id, a.first_offset, a.last_offset, a.last_stable_offset)
                    for a in aborted)


def decode_txn_index(data: bytes) -> list[AbortedTxn]:
    if len(data) % TXN_ENTRY.size:
        raise ValueError(f"txn index of {len(data)} bytes is not a whole number of entries")
    return [AbortedTxn(*TXN_ENTRY.unpack_from(data, i)[1:]) for i in range(0, len(data), TXN_ENTRY.size)]


def encode_producer_snapshot(producers: dict[int, ProducerEntry]) -> bytes:
    body = struct.pack(">i", len(producers)) + b"".join(
        PRODUCER_ENTRY.pack(e.producer_id, e.epoch, e.last_sequence, e.last_offset, e.offset_delta, e.timestamp,
                            e.coordinator_epoch, e.current_txn_first_offset)
        for e in sorted(producers.values(), key=lambda e: e.producer_id))
    return SNAPSHOT_HEADER.pack(1, crc32c.crc32c(body)) + body


def decode_producer_snapshot(data: bytes) -> dict[int, ProducerEntry]:
    version, crc = SNAPSHOT_HEADER.unpack_from(data, 0)
    body = data[SNAPSHOT_HEADER.size:]
    if version != 1 or crc32c.crc32c(body) != crc:
        raise ValueError("producer snapshot: bad version or CRC")
    (n,) = struct.unpack_from(">i", body, 0)
    entries = [ProducerEntry(*PRODUCER_ENTRY.unpack_from(body, 4 + i * PRODUCER_ENTRY.size)) for i in range(n)]
    return {e.producer_id: e for e in entries}


def lookup_position(offset_index: bytes, start_offset: int, target: int) -> int:
    """Byte position to scan from for `target`: the batch start of the largest indexed offset ≤ target."""
    n = len(offset_index) // OFFSET_ENTRY.size
    rel = target - start_offset
    keys = [OFFSET_ENTRY.unpack_from(offset_index, i * OFFSET_ENTRY.size)[0] for i in range(n)]
    i = bisect.bisect_right(keys, rel)
    return 0 if i == 0 else int(OFFSET_ENTRY.unpack_from(offset_index, (i - 1) * OFFSET_ENTRY.size)[1])


def index_positions(offset_index: bytes) -> Sequence[int]:
    """The offset index's byte positions (each a batch start, ascending), decoded at once for bisecting."""
    entries = array.array("i", offset_index)  # relative_offset:int32 position:int32, big-endian
    if sys.byteorder == "little":
        entries.byteswap()
    return entries[1::2]


def lookup_time(time_index: bytes, start_offset: int, timestamp: int) -> int:
    """A relative-offset floor to scan from for the first record with timestamp ≥ `timestamp`."""
    best = 0
    for i in range(0, len(time_index), TIME_ENTRY.size):
        ts, rel = TIME_ENTRY.unpack_from(time_index, i)
        if ts >= timestamp:
            break
        best = rel
    return start_offset + best


def record_at_or_after(records: bytes | memoryview, ts: int, min_offset: int = 0) -> tuple[int, int] | None:
    """(offset, timestamp) of the first record of `records` (whole batches, in offset order) whose timestamp is ≥
    `ts` and whose offset is ≥ `min_offset`, control batches skipped: the scan from `lookup_time`'s floor that
    answers a look-up by time (Kafka's `findOffsetByTimestamp`)."""
    for batch in iter_batches(records):
        if batch.max_timestamp < ts or batch.is_control:
            continue
        for rec in batch.records():
            if rec.timestamp >= ts and rec.offset >= min_offset:
                return rec.offset, rec.timestamp
    return None


def build_segment(records: bytes, producers: dict[int, ProducerEntry] | None = None,
                  txn_starts: list[tuple[int, int]] | None = None) -> SegmentFiles:
    """All whole batches of `records` as one segment (tests and tools)."""
    b = SegmentBuilder(producers, txn_starts=txn_starts)
    for batch in iter_batches(records):
        b.add(batch)
    return b.finish()
