"""The driver's half of the DataFrame reader: which topic partitions, which offsets, which segments and bytes.

A `Slice` is one tiered segment (or one byte range of a large one: cut at offset-index entries, so every batch
belongs to exactly one range, and at most `READ_BYTES` so one read's memory stays bounded), or one partition's live
range on the brokers. Offsets and timestamps are resolved here, through the segments' metadata and their offset and
time indexes, so a narrow range reads only the segments and bytes that hold it.

Input partitions are slices packed as Spark's file sources pack files (`FilePartition.getFilePartitions`): in plan
order, up to `maxBytesPerPartition` counting `OPEN_COST` per slice, or fewer bytes when `minPartitions` asks for more
partitions. A live range is an input partition of its own (its size is not known before it is read).
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import re
from dataclasses import dataclass, field

from tierproxy.jobs.spark.options import EARLIEST, LATEST, OptionError, ReadOptions
from tierproxy.jobs.spark.slices import READ_BYTES, Slice, pack
from tierproxy.jobs.tiering.cluster import ClusterView, PartitionInfo, PartitionOffsets
from tierproxy.tier.indexes import OFFSET_ENTRY, decode_txn_index, lookup_position, lookup_time
from tierproxy.tier.model import RemoteLogSegmentMetadata, TxnOutcome
from tierproxy.tier.rsm import IndexType, RemoteStorageManager
from tierproxy.tier.rules import holes_between, served_segments, tier_start
from tierproxy.tier.timescan import scan_log_for_time
from tierproxy.tier.transactions import OPEN_ABOVE, decided, unmarked_aborts


class DataLoss(RuntimeError):
    """Offsets in the requested range exist neither in the tier nor on the brokers (failOnDataLoss=true)."""


@dataclass
class PartitionPlan:
    info: PartitionInfo
    segments: list[RemoteLogSegmentMetadata]
    live: PartitionOffsets | None
    aborted: list[tuple[int, int, int]] = field(default_factory=list)  # (producer id, first, last) from txn indexes
    log_start: int = 0  # a purge's (DeleteRecords) log start: nothing below it is read
    # (producer id, first offset) → the tier's recorded outcome of a transaction open at a segment's end: final
    outcomes: dict[tuple[int, int], TxnOutcome] = field(default_factory=dict)

    @property
    def tier_start(self) -> int:
        start = tier_start(self.segments, self.log_start)
        return -1 if start is None else start

    @property
    def tier_end(self) -> int:
        """The last tiered offset, -1 when nothing is tiered."""
        return self.segments[-1].end_offset if self.segments else -1


def select_partitions(view: ClusterView, o: ReadOptions) -> list[PartitionInfo]:
    if o.assign is not None:
        wanted = {(t, p) for t, ps in o.assign.items() for p in ps}
        found = [p for p in view.partitions if (p.topic, p.partition) in wanted]
        missing = wanted - {(p.topic, p.partition) for p in found}
        if missing:
            raise OptionError(f"option 'assign': {sorted(missing)[0]} is not a partition of the cluster")
        return found
    if o.pattern is not None:
        rx = re.compile(o.pattern)
        return [p for p in view.partitions if p.topic not in view.internal and rx.fullmatch(p.topic)]
    missing_topics = set(o.subscribe) - {p.topic for p in view.partitions}
    if missing_topics:
        raise OptionError(f"option 'subscribe': topic {sorted(missing_topics)[0]!r} does not exist")
    return [p for p in view.partitions if p.topic in o.subscribe]


class Planner:
    """Plans a read: run on the driver, once per query."""

    def __init__(self, options: ReadOptions) -> None:
        self.o = options
        self.leaders: dict[PartitionInfo, str] = {}

    def plan(self) -> list[Slice]:
        return asyncio.run(self._plan())

    def input_partitions(self) -> list[tuple[Slice, ...]]:
        return pack(self.plan(), self.o.max_bytes_per_partition, self.o.min_partitions)

    async def _plan(self) -> list[Slice]:
        # the planner's imports stay out of the executors' read path (each read task unpickles this module)
        from tierproxy.jobs.tiering.cluster import describe_cluster, list_offsets, mounted
        from tierproxy.tier.open import open_metadata

        o = self.o
        view = describe_cluster(o.bootstrap)
        parts = select_partitions(view, o)
        live = list_offsets(view, parts)
        self.leaders = {p: view.leader_address(p) for p in parts if p.leader >= 0}
        rlmm = open_metadata(o.metadata, o.bootstrap)
        rsm = RemoteStorageManager.from_uri(o.storage)
        await rlmm.start()
        try:
            if rlmm.cache.aliases:  # a restored topic is read as the history it continues, under that id
                view = mounted(view, rlmm.cache.aliases)
                parts = select_partitions(view, o)
                self.leaders = {p: view.leader_address(p) for p in parts if p.leader >= 0}
            plans = []
            for p in parts:
                pc = rlmm.cache.get(p.topic_id, p.partition)  # by topic id: a re-created topic has no old history
                served = served_segments(pc.finished(), pc.log_start_offset) if pc else []
                plans.append(PartitionPlan(p, served, live.get((p.topic, p.partition)),
                                           log_start=pc.log_start_offset if pc else 0,
                                           outcomes=decided(pc.outcomes) if pc else {}))
            self._planned(view, plans, rlmm)
            slices: list[Slice] = []
            for pp in plans:
                slices += await self._partition_slices(view, pp, rsm)
            return slices
        finally:
            await rsm.close()
            await rlmm.close()

    def _planned(self, view: ClusterView, plans: list[PartitionPlan], rlmm: object) -> None:
        """Called with the partitions' plans and the loaded metadata before slicing (a hook for subclasses)."""

    # --- offsets -----------------------------------------------------------------------------------------------
    def _earliest(self, pp: PartitionPlan) -> int:
        if pp.segments:
            return pp.tier_start
        return pp.live.log_start if (self.o.include_live and pp.live) else 0

    def _latest(self, pp: PartitionPlan) -> int:
        if self.o.include_live and pp.live is not None:
            return pp.live.last_stable if self.o.read_committed else pp.live.high_watermark
        return pp.tier_end + 1 if pp.segments else 0

    def _spec(self, spec: object, pp: PartitionPlan, default: int) -> int:
        key = (pp.info.topic, pp.info.partition)
        if spec == "earliest":
            return self._earliest(pp)
        if spec == "latest":
            return self._latest(pp)
        assert isinstance(spec, dict)
        value = spec.get(key)
        if value is None:
            return default
        return self._earliest(pp) if value == EARLIEST else self._latest(pp) if value == LATEST else int(value)

    async def _by_time(self, ts_spec: dict[tuple[str, int], int] | int | None, pp: PartitionPlan,
                       rsm: RemoteStorageManager, starting: bool) -> int | None:
        if ts_spec is None:
            return None
        ts = ts_spec.get((pp.info.topic, pp.info.partition)) if isinstance(ts_spec, dict) else ts_spec
        if ts is None:
            return None
        found = await offset_for_time(pp, int(ts), rsm, self.o, self.leaders.get(pp.info))
        if found is not None:
            return found
        if starting and self.o.ts_strategy == "error":
            raise OptionError(f"no record at or after timestamp {ts} in {pp.info.topic}-{pp.info.partition} "
                              "(set startingOffsetsByTimestampStrategy=latest to start at the latest offset)")
        return self._latest(pp)

    # --- slices ------------------------------------------------------------------------------------------------
    async def _partition_slices(self, view: ClusterView, pp: PartitionPlan, rsm: RemoteStorageManager) -> list[Slice]:
        o, info = self.o, pp.info
        start = await self._by_time(o.starting_ts, pp, rsm, True)
        start = self._spec(o.starting, pp, self._earliest(pp)) if start is None else start
        end = await self._by_time(o.ending_ts, pp, rsm, False)
        end = self._spec(o.ending, pp, self._latest(pp)) if end is None else end
        if start < pp.log_start < end:  # purged by DeleteRecords: gone, as from the brokers
            start = self._lost(pp, start, pp.log_start)
        if end <= start:
            return []
        out: list[Slice] = self._holes(view, pp, start, end)
        if o.read_committed:
            # the indexes from the oldest recorded abort's start on: a marker below `start` tells where it ended
            since = min([start, *(first for (_, first), oc in pp.outcomes.items() if oc == TxnOutcome.ABORTED)])
            pp.aborted = [(a.producer_id, a.first_offset, a.last_offset)
                          for md in pp.segments if not md.txn_index_empty and md.end_offset >= since
                          for a in decode_txn_index(await rsm.fetch_index(md, IndexType.TRANSACTION))]
            # aborts the tier recorded whose markers it does not hold (a cluster's log may know nothing of them)
            pp.aborted += await unmarked_aborts(pp.outcomes, [(pid, first) for pid, first, _ in pp.aborted],
                                                pp.segments, rsm)
            if pp.segments and pp.live is not None and info in self.leaders:
                from tierproxy.jobs.spark.live import live_aborted_reaching

                # aborts whose markers are still only in the broker's log: they end beyond the tier
                pp.aborted += [(pid, first, OPEN_ABOVE) for pid, first in
                               live_aborted_reaching(self.leaders[info], info.topic, info.partition,
                                                     pp.live.log_start)
                               if first <= pp.tier_end and (pid, first) not in pp.outcomes]
        for md in pp.segments:
            if md.end_offset < start or md.start_offset >= end:
                continue
            lo, hi = max(start, md.start_offset), min(end, md.end_offset + 1)
            aborted = tuple((pid, first) for pid, first, last in pp.aborted if last >= lo and first < hi)
            for byte_range in await self._byte_ranges(md, rsm):
                out.append(Slice(info.topic, info.partition, lo, hi, md, byte_range, aborted=aborted))
        live_start = max(start, pp.tier_end + 1)
        if o.include_live and live_start < end and pp.live is not None:
            if pp.live.log_start > live_start:
                live_start = self._lost(pp, live_start, pp.live.log_start)
            out.append(Slice(info.topic, info.partition, live_start, end, leader=view.leader_address(info)))
        elif not o.include_live and pp.segments and end > pp.tier_end + 1:
            self._lost(pp, pp.tier_end + 1, end)
        return sorted(out, key=lambda s: s.start)

    def _holes(self, view: ClusterView, pp: PartitionPlan, start: int, end: int) -> list[Slice]:
        """Holes between tiered segments inside [start, end): with includeLive, the part the brokers still hold
        is read from them (as a consumer through the proxy reads it); what neither holds is lost, as is anything
        asked for before the tier's first segment."""
        out = []
        if pp.segments and start < pp.segments[0].start_offset:
            self._lost(pp, start, min(end, pp.segments[0].start_offset))
        for a, b in holes_between(pp.segments):
            a, b = max(a, start), min(b, end)
            if a >= b:
                continue
            held = pp.live.log_start if (self.o.include_live and pp.live is not None and pp.info.leader >= 0) else b
            if held > a:
                self._lost(pp, a, min(held, b))
            if held < b:
                out.append(Slice(pp.info.topic, pp.info.partition, max(a, held), b,
                                 leader=view.leader_address(pp.info)))
        return out

    def _lost(self, pp: PartitionPlan, first: int, until: int) -> int:
        what = f"{pp.info.topic}-{pp.info.partition} offsets [{first}, {until})"
        if self.o.fail_on_data_loss:
            raise DataLoss(f"{what} are neither tiered nor on the brokers (set failOnDataLoss=false to skip them, "
                           "or includeLive=true to read the brokers' live range)")
        return until

    async def _byte_ranges(self, md: RemoteLogSegmentMetadata,
                           rsm: RemoteStorageManager) -> list[tuple[int, int] | None]:
        limit = min(READ_BYTES, self.o.max_bytes_per_partition)
        if md.segment_size_in_bytes <= limit:
            return [None]
        index = await rsm.fetch_index(md, IndexType.OFFSET)
        cuts = [0]
        for i in range(0, len(index), OFFSET_ENTRY.size):
            pos = OFFSET_ENTRY.unpack_from(index, i)[1]
            if pos - cuts[-1] >= limit:
                cuts.append(pos)
        cuts.append(md.segment_size_in_bytes)
        return [(a, b) for a, b in itertools.pairwise(cuts) if b > a]


async def offset_for_time(pp: PartitionPlan, ts: int, rsm: RemoteStorageManager, o: ReadOptions,
                          leader: str | None) -> int | None:
    """The first offset whose record timestamp ≥ `ts`: the tier through segment max timestamps and the time index,
    then (with includeLive) the brokers (ListOffsets by timestamp). None: no such record."""
    for md in pp.segments:
        if md.max_timestamp_ms < ts:
            continue
        floor = lookup_time(await rsm.fetch_index(md, IndexType.TIMESTAMP), md.start_offset, ts)
        pos = lookup_position(await rsm.fetch_index(md, IndexType.OFFSET), md.start_offset, floor)
        found = await scan_log_for_time(functools.partial(rsm.fetch_log, md), pos, md.segment_size_in_bytes,
                                        ts)  # a step at a time, not the rest of the segment
        if found is not None:
            return found[0]
    if o.include_live and leader is not None:
        from tierproxy.jobs.spark.live import live_offset_for_time

        return live_offset_for_time(leader, pp.info.topic, pp.info.partition, ts)
    return None
