"""Record batches → rows in the schema of Spark's Kafka source, as Arrow record batches (no per-row Python objects
cross into Spark).

Batches are the exact bytes the broker served (from the tier or a live fetch). Control batches never become rows;
with read_committed, a transactional batch of a producer whose transaction is known aborted is dropped — the Java
consumer's rule (`CompletedFetch`): before each batch, every aborted transaction whose first offset is at or below
the batch's last offset marks its producer as aborted; that producer's ABORT marker clears it.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator
from typing import Any

from protocol.records import ABORT, RecordBatch
from tierproxy.jobs.spark.columns import RecordColumns

SCHEMA_DDL = ("key binary, value binary, topic string, partition int, offset long, timestamp timestamp, "
              "timestampType int")
HEADERS_DDL = "headers array<struct<key: string, value: binary>>"
ROWS_PER_BATCH = 8192
BYTES_PER_BATCH = 64 << 20  # bounds a worker's memory and keeps binary columns far below Arrow's 2 GiB offsets


def schema_ddl(include_headers: bool) -> str:
    return f"{SCHEMA_DDL}, {HEADERS_DDL}" if include_headers else SCHEMA_DDL


def visible_batches(batches: Iterable[RecordBatch], read_committed: bool,
                    aborted: list[tuple[int, int]]) -> Iterator[RecordBatch]:
    """Data batches a consumer with this isolation level sees (control batches never; aborted ones with
    read_committed). `aborted` holds (producer id, first offset) of aborted transactions overlapping the range; it
    may grow while batches are read (a live read appends what each fetch response reports, before its batches)."""
    heap: list[tuple[int, int]] = []
    taken = 0
    aborted_pids: set[int] = set()
    for b in batches:
        pid = b.producer_id
        if read_committed and pid >= 0:
            if taken < len(aborted):
                for producer, first in aborted[taken:]:
                    heapq.heappush(heap, (first, producer))
                taken = len(aborted)
            last = b.last_offset
            while heap and heap[0][0] <= last:
                aborted_pids.add(heapq.heappop(heap)[1])
            if b.is_control:
                if b.control_record().type == ABORT:
                    aborted_pids.discard(pid)
                continue
            if b.is_transactional and pid in aborted_pids:
                continue
        elif b.is_control:
            continue
        yield b


def arrow_batches(batches: Iterable[RecordBatch], *, topic: str, partition: int, start: int, end: int,
                  include_headers: bool, read_committed: bool, aborted: list[tuple[int, int]],
                  schema: Any, rows_per_batch: int = ROWS_PER_BATCH,
                  bytes_per_batch: int = BYTES_PER_BATCH) -> Iterator[Any]:
    """Arrow record batches of the records with start ≤ offset < end, in `schema` (Spark's expected Arrow schema)."""
    cols = RecordColumns(include_headers)
    for b in visible_batches(batches, read_committed, aborted):
        if b.base_offset >= end:
            break
        if b.last_offset < start:
            continue
        cols.decode(b, start, end)
        if len(cols) >= rows_per_batch or cols.nbytes >= bytes_per_batch:
            yield cols.to_arrow(topic, partition, schema)
            # the next batch's buffers sized as this one's were: most batches then never grow them
            cols = RecordColumns(include_headers, like=cols)
    if len(cols):
        yield cols.to_arrow(topic, partition, schema)
