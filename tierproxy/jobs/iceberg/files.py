"""The executors' half: one tier slice (a segment, or a byte range of a large one) → one Parquet data file.

Rows are decoded by the DataFrame reader's path (`spark.rows` / `spark.columns`: the exact batch bytes from the tier,
control batches never rows, aborted transactions dropped under read_committed), then written batch by batch with
zstd, so an executor holds at most one read range (≤ `spark.slices.READ_BYTES`) and one Arrow batch at a time.

Each result also says which transactions the slice leaves open (`opens`: producer id → first offset of data not
followed by its marker in the slice) and which producers wrote a marker in it (`closes`): the driver needs both to
hold back segments whose transactions' outcomes are not tiered yet.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from protocol.errors import ProtocolError
from protocol.records import RecordBatch
from tierproxy.jobs.iceberg.schema import TOPIC_ID
from tierproxy.jobs.spark.columns import RecordColumns
from tierproxy.jobs.spark.rows import ROWS_PER_BATCH, visible_batches
from tierproxy.jobs.spark.slices import Slice
from tierproxy.jobs.spark.source import read_tier_slice
from tierproxy.tier.model import uuid_str

ROW_GROUP_ROWS = 128 * 1024


def data_file_path(table_location: str, s: Slice, pass_id: str) -> str:
    """Where a slice's rows go: under the table's partition directories, named by the segment's first offset and
    id, the byte range and the pass (a killed pass's files are told apart from a committed one's by that)."""
    assert s.segment is not None
    lo = s.byte_range[0] if s.byte_range else 0
    seg = uuid_str(s.segment.segment_id.id)
    return (f"{table_location.rstrip('/')}/data/topic={quote(s.topic, safe='')}/partition={s.partition}/"
            f"{s.segment.start_offset:020d}-{seg}-{lo}-{pass_id}.parquet")


class TransactionTracker:
    """Watches every batch of a slice (control ones too) for the markers and the still-open transactions."""

    def __init__(self) -> None:
        self.opens: dict[int, int] = {}
        self.closes: set[int] = set()

    def see(self, batches: Iterator[RecordBatch]) -> Iterator[RecordBatch]:
        for b in batches:
            if b.is_transactional:
                pid = b.producer_id
                if b.is_control:
                    self.closes.add(pid)
                    self.opens.pop(pid, None)
                else:
                    self.opens.setdefault(pid, b.base_offset)
            yield b


def checked(batches: Iterator[RecordBatch], s: Slice) -> Iterator[RecordBatch]:
    """Every batch's CRC-32C verified: bytes that fail it never become rows."""
    assert s.segment is not None
    for b in batches:
        if not b.crc_ok():
            raise ProtocolError(f"{s.topic}-{s.partition} tiered segment {uuid_str(s.segment.segment_id.id)} "
                                f"(offsets {s.segment.start_offset}..{s.segment.end_offset}): the batch at offset "
                                f"{b.base_offset} fails its CRC; nothing of this pass was committed")
        yield b


def _source_schema(pa: Any) -> Any:
    """The Arrow schema `RecordColumns.to_arrow` builds (Spark's Kafka source's, headers included)."""
    header = pa.struct([pa.field("key", pa.string(), nullable=False), pa.field("value", pa.binary())])
    return pa.schema([("key", pa.binary()), ("value", pa.binary()), ("topic", pa.string()),
                      ("partition", pa.int32()), ("offset", pa.int64()), ("timestamp", pa.timestamp("us", "UTC")),
                      ("timestampType", pa.int32()), ("headers", pa.list_(pa.field("element", header,
                                                                                    nullable=False)))])


def table_batches(batches: Iterator[RecordBatch], s: Slice, read_committed: bool, target: Any) -> Iterator[Any]:
    """Arrow batches in `target`, the table's Arrow schema (leaderEpoch and producerId added from each record's
    batch, topicId from the slice's segment: the incarnation the rows are of)."""
    import numpy as np
    import pyarrow as pa

    assert s.segment is not None
    source = _source_schema(pa)
    topic_id = uuid_str(s.segment.segment_id.tp.topic_id)
    cols = RecordColumns(True)
    epochs: list[tuple[int, int, int]] = []  # (rows so far, leader epoch, producer id) after each batch

    def flush() -> Any:
        n = len(cols)
        counts = np.diff([0] + [r for r, _, _ in epochs])
        rb = cols.to_arrow(s.topic, s.partition, source)
        extra = {"leaderEpoch": pa.array(np.repeat(np.array([e for _, e, _ in epochs], np.int32), counts)),
                 "producerId": pa.array(np.repeat(np.array([p for _, _, p in epochs], np.int64), counts)),
                 TOPIC_ID: pa.array([topic_id] * n, pa.string())}
        assert sum(counts) == n
        columns = dict(zip(rb.schema.names, rb.columns, strict=True)) | extra
        return pa.RecordBatch.from_arrays([columns[c] for c in target.names], names=target.names).cast(target)

    aborted = list(s.aborted)
    for b in visible_batches(batches, read_committed, aborted):
        if b.base_offset >= s.end:
            break
        if b.last_offset < s.start:
            continue
        cols.decode(b, s.start, s.end)
        epochs.append((len(cols), b.partition_leader_epoch, b.producer_id))
        if len(cols) >= ROWS_PER_BATCH or cols.nbytes >= 64 << 20:
            yield flush()
            cols, epochs = RecordColumns(True, like=cols), []
    if len(cols):
        yield flush()


@dataclass(frozen=True)
class SliceWritten:
    """What an executor answers for one slice: its file (None: no visible row) and what the driver checks before
    committing it (the transactions the slice saw open and close, where the slice lies), or the error."""

    paths: tuple[str, ...]  # its data files (none: no visible row; several: one per hour or day of the rows)
    rows: int = 0
    topic: str = ""
    partition: int = -1
    topic_id: str = ""  # uuid string, as the ledger keys it
    segment: str = ""  # the segment's id (uuid string)
    start: int = 0  # [start, end): the slice's offsets
    end: int = 0
    segment_end: int = -1
    byte_start: int = 0  # where the slice starts in its segment (its slices commit in byte order)
    opens: dict[int, int] = field(default_factory=dict)  # producer id → first offset of a transaction still open
    closes: list[int] = field(default_factory=list)  # producer ids whose transaction marker the slice holds
    error: str | None = None
    peak_rss_kb: int = 0
    rss_before_kb: int = 0
    dlq_paths: tuple[str, ...] = ()  # a typed table's dead letters of this slice
    dlq_rows: int = 0
    error_kind: str = ""  # "data": the tier's bytes; "registry": the schema registry could not be asked


class LazyParquet:
    """A data file opened at its first non-empty batch (a slice with no row leaves no file), zstd with statistics;
    `close(discard=True)` removes what a failed slice wrote."""

    def __init__(self, fileio: Any, path: str, schema: Any) -> None:
        self.io, self.path, self.schema = fileio, path, schema
        self.rows = 0
        self._out: Any = None
        self._writer: Any = None

    def write(self, rb: Any) -> None:
        import pyarrow.parquet as pq

        if rb.num_rows == 0:
            return
        if self._writer is None:
            self._out = self.io.new_output(self.path).create(overwrite=True)
            self._writer = pq.ParquetWriter(self._out, self.schema, compression="zstd", write_statistics=True)
        self._writer.write_batch(rb, row_group_size=ROW_GROUP_ROWS)
        self.rows += rb.num_rows

    def close(self, discard: bool = False) -> str | None:
        """The file's path, or None when no row was written or `discard`."""
        if self._writer is None:
            return None
        try:
            self._writer.close()
        finally:
            self._out.close()
        if discard:
            self.io.delete(self.path)
            return None
        return self.path


class SplitParquet:
    """A slice's data files for one table: one, or, when the table is partitioned by the hour or day of a
    timestamp (`bucket`: its column and microseconds per bucket), one per bucket its rows fall in. At most
    MAX_OPEN are open at once (each holds a row group in memory): a bucket met again after its file was closed
    gets another file, so memory stays bounded whatever the timestamps; compaction merges them later."""

    MAX_OPEN = 8

    def __init__(self, fileio: Any, path: str, schema: Any, bucket: tuple[str, int] | None) -> None:
        self.io, self.path, self.schema, self.bucket = fileio, path, schema, bucket
        self._open: dict[int | None, LazyParquet] = {}  # in use order: the first is the least recently written
        self._done: list[str] = []  # files closed to make room
        self._rows_done = 0
        self._parts: dict[int, int] = {}

    @property
    def rows(self) -> int:
        return self._rows_done + sum(f.rows for f in self._open.values())

    def write(self, rb: Any) -> None:
        import numpy as np
        import pyarrow as pa

        if rb.num_rows == 0:
            return
        if self.bucket is None:
            self._file(None).write(rb)
            return
        column, unit = self.bucket
        buckets = np.floor_divide(rb.column(column).cast(pa.int64()).to_numpy(zero_copy_only=False), unit)
        if buckets.min() == buckets.max():
            self._file(int(buckets[0])).write(rb)
            return
        for b in np.unique(buckets):  # each bucket's rows keep their (offset) order
            self._file(int(b)).write(rb.filter(pa.array(buckets == b)))

    def _file(self, bucket: int | None) -> LazyParquet:
        f = self._open.pop(bucket, None)
        if f is None:
            if len(self._open) >= self.MAX_OPEN:
                oldest = self._open.pop(next(iter(self._open)))
                if (closed := oldest.close()) is not None:
                    self._done.append(closed)
                    self._rows_done += oldest.rows
            path = self.path
            if bucket is not None:  # before "-<pass>.parquet": the pass still names the file
                part = self._parts[bucket] = self._parts.get(bucket, -1) + 1
                head, _, tail = path.rpartition("-")
                path = f"{head}-t{bucket}{f'.{part}' if part else ''}-{tail}"
            f = LazyParquet(self.io, path, self.schema)
        self._open[bucket] = f
        return f

    def close(self, discard: bool = False) -> tuple[str, ...]:
        """The files written, sorted (none when no row was, or `discard`: then every file is removed; also when
        one fails to close, which is raised)."""
        error: BaseException | None = None
        for f in self._open.values():
            try:
                if (closed := f.close(discard=discard or error is not None)) is not None:
                    self._done.append(closed)
                    self._rows_done += f.rows
            except BaseException as exc:  # the others are still closed (and removed) before it is raised
                error = error or exc
        self._open = {}
        done, self._done = self._done, []
        if discard or error is not None:
            for p in done:
                self.io.delete(p)
            if error is not None:
                raise error
            return ()
        return tuple(sorted(done))


def write_slice(storage: str, table_location: str, io_properties: dict[str, str], s: Slice, read_committed: bool,
                pass_id: str, target: Any, bucket: tuple[str, int] | None = None) -> SliceWritten:
    """Run on an executor: the slice's rows → a Parquet file in `target` (the table's Arrow schema, its field
    ids included; one per time bucket with `bucket`), none when no row is visible. Returns what the driver commits
    and checks."""
    from pyiceberg.io import load_file_io

    assert s.segment is not None
    rss_before = peak_rss_kb()  # the worker's imports and earlier tasks: what this slice's work adds is above it
    tracker = TransactionTracker()
    path = data_file_path(table_location, s, pass_id)
    parquet = SplitParquet(load_file_io(properties=io_properties, location=path), path, target, bucket)
    error: str | None = None
    done = False
    try:
        for rb in table_batches(tracker.see(checked(read_tier_slice(storage, s), s)), s, read_committed, target):
            parquet.write(rb)
        done = True
    except ProtocolError as exc:  # the driver stops the pass naming the segment (no task retry can help)
        error = str(exc)
    finally:  # a failed slice leaves no file behind (a retried task writes its own)
        written = parquet.close(discard=not done)
    if error is not None:
        return SliceWritten((), error=error)
    return SliceWritten(written, parquet.rows, s.topic, s.partition, uuid_str(s.segment.segment_id.tp.topic_id),
                        uuid_str(s.segment.segment_id.id), s.start, s.end, s.segment.end_offset,
                        s.byte_range[0] if s.byte_range else 0, dict(tracker.opens), sorted(tracker.closes),
                        None, peak_rss_kb(), rss_before)


def peak_rss_kb() -> int:
    """The executor's Python worker's peak resident memory so far (what one slice's read and write cost is
    bounded by: the read range, one Arrow batch, the Parquet writer's row group)."""
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
