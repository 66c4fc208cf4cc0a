"""`spark.read.format("tierproxy")`: a Python Data Source (PySpark ≥ 4.0) over the tiered history.

The driver plans (`plan.Planner`: a slice per segment or byte range, packed into input partitions as Spark packs
files, plus the live range); each executor reads its slices straight from storage — offset index → byte range →
one ranged read — or from the partition leader for the live range, and turns the batches into Arrow record batches
in the schema of Spark's own Kafka source.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from protocol.records import RecordBatch, iter_batches
from tierproxy.jobs.spark.options import ReadOptions, parse_options
from tierproxy.jobs.spark.rows import arrow_batches, schema_ddl
from tierproxy.jobs.spark.slices import Slice
from tierproxy.tier.indexes import OFFSET_ENTRY, lookup_position
from tierproxy.tier.rsm import LOG_EXT, IndexType, RemoteStorageManager
from tierproxy.tier.storage import FileStore


class SliceInput(InputPartition):
    """One Spark input partition: slices read one after the other."""

    def __init__(self, value: tuple[Slice, ...]) -> None:
        super().__init__(value)


class TierDataSource(DataSource):
    """The "tierproxy" format."""

    @classmethod
    def name(cls) -> str:
        return "tierproxy"

    def schema(self) -> str:
        return schema_ddl(parse_options(dict(self.options)).include_headers)

    def reader(self, schema: StructType) -> TierReader:
        return TierReader(parse_options(dict(self.options)), schema)


class TierReader(DataSourceReader):
    def __init__(self, options: ReadOptions, schema: StructType) -> None:
        self.options = options
        self.schema = schema

    def partitions(self) -> Sequence[InputPartition]:
        from tierproxy.jobs.spark.plan import Planner

        return [SliceInput(group) for group in Planner(self.options).input_partitions()]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        from pyspark.sql.pandas.types import to_arrow_schema

        schema = to_arrow_schema(self.schema, timezone="UTC")
        for s in partition.value:
            yield from self._read_slice(s, schema)

    def _read_slice(self, s: Slice, schema: Any) -> Iterator[Any]:
        o = self.options
        aborted = list(s.aborted)
        if s.segment is not None:
            batches = read_tier_slice(o.storage, s)
        else:
            from tierproxy.jobs.spark.live import live_batches

            batches = live_batches(s.leader, s.topic, s.partition, s.start, s.end, o.read_committed, aborted)
        yield from arrow_batches(batches, topic=s.topic, partition=s.partition, start=s.start, end=s.end,
                                 include_headers=o.include_headers, read_committed=o.read_committed,
                                 aborted=aborted, schema=schema)


def byte_range(offset_index: bytes, segment_start: int, size: int, start: int, end: int) -> tuple[int, int]:
    """Bytes of a segment that hold offsets [start, end): from the batch the offset index puts at or before
    `start`, to the position of the first indexed batch that begins after `end` (or the segment's end).
    Index entries map a batch's last offset to its position, so the batch after an entry whose offset reaches
    `end` begins past it."""
    first = lookup_position(offset_index, segment_start, start)
    n = len(offset_index) // OFFSET_ENTRY.size
    reached = False
    for i in range(n):
        rel, pos = OFFSET_ENTRY.unpack_from(offset_index, i * OFFSET_ENTRY.size)
        if reached and pos > first:
            return first, int(pos)
        reached = segment_start + rel >= end - 1
    return first, size


def read_tier_slice(storage: str, s: Slice) -> Iterator[RecordBatch]:
    """The batches of a tier slice, read with one ranged GET of just the bytes it needs."""
    md = s.segment
    assert md is not None
    rsm = RemoteStorageManager.from_uri(storage)

    def span(index: bytes | None) -> tuple[int, int]:
        if s.byte_range is not None:
            return s.byte_range
        if index is None:
            return 0, md.segment_size_in_bytes
        return byte_range(index, md.start_offset, md.segment_size_in_bytes, s.start, s.end)

    needs_index = s.byte_range is None and not (s.start <= md.start_offset and s.end > md.end_offset)
    if isinstance(rsm.store, FileStore):  # no event loop for a local read
        index = rsm.store.get_blocking(rsm.key(md, IndexType.OFFSET.value)) if needs_index else None
        lo, hi = span(index)
        return iter_batches(rsm.store.get_blocking(rsm.key(md, LOG_EXT), lo, hi))

    async def fetch() -> bytes:
        try:
            lo, hi = span(await rsm.fetch_index(md, IndexType.OFFSET) if needs_index else None)
            return await rsm.fetch_log(md, lo, hi)
        finally:
            await rsm.close()

    return iter_batches(_worker_loop().run_until_complete(fetch()))


_loop: asyncio.AbstractEventLoop | None = None


def _worker_loop() -> asyncio.AbstractEventLoop:
    """One event loop per Python worker, reused by its tasks: `asyncio.run` per task (a new loop, signal handlers,
    a default executor to shut down) measured slower than the read itself inside Spark's Python workers."""
    global _loop
    if _loop is None or _loop.is_closed():
        _loop = asyncio.new_event_loop()
    return _loop
