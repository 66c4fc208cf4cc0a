"""An in-memory remote tier for `tests/core`: a `RemoteTierView` over real segment metadata (the real
`MetadataCache` and its rules) and real record batches held in memory, whose reads, failures, pool and leaders a
test scripts. The intercepts run against it exactly as against the service; no storage, no broker."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from protocol.records import Record, build_batch, iter_batches
from tierproxy.remote.pool import PoolFull
from tierproxy.remote.quota import RemoteFetchQuota
from tierproxy.remote.reader import ReadResult
from tierproxy.remote.view import BrokerOffsets
from tierproxy.tier.cache import MetadataCache, PartitionCache
from tierproxy.tier.indexes import AbortedTxn
from tierproxy.tier.model import (
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogStartOffset,
    SegmentState,
    TopicIdPartition,
)


def batches(first: int, last: int, per_batch: int = 10, value_bytes: int = 100) -> list[bytes]:
    """Real v2 batches holding offsets first..last, `per_batch` records each."""
    out = []
    for base in range(first, last + 1, per_batch):
        top = min(base + per_batch - 1, last)
        out.append(build_batch([Record(o, 1_000 + o, None, bytes([o % 251]) * value_bytes)
                                for o in range(base, top + 1)], base_offset=base))
    return out


@dataclass
class ReadScript:
    """How the next reads behave: wait for `gate`, fail with `failure`, or the pool refuses them."""

    gate: asyncio.Event | None = None
    failure: BaseException | None = None
    pool_full: bool = False
    slots: int = 1_000_000  # what `read_slots` answers while the pool is not full
    aborted: list[AbortedTxn] = field(default_factory=list)


class InMemoryTier:
    """A tier holding segments of real batches; `leaders` are the brokers' offsets a test sets (None: the leader
    cannot be asked)."""

    def __init__(self, quota: RemoteFetchQuota | None = None) -> None:
        self.cache = MetadataCache()
        self.data: dict[bytes, list[bytes]] = {}  # segment id → its batches
        self.leaders: dict[tuple[str, int], BrokerOffsets | None] = {}
        self.script = ReadScript()
        self.reads: list[tuple[str, int, int, int, bool]] = []  # (topic, partition, offset, max bytes, min one)
        self.current_ids: dict[str, bytes] = {}
        self.ids_on_refresh: dict[str, bytes] = {}  # a topic's id as the next refresh learns it (recreated topic)
        self.refresh_gate: asyncio.Event | None = None
        self.unnamed_on_refresh: set[str] = set()  # topics the next refreshes' answers do not name without error
        self.refreshes = 0
        # like the real service, answer "fresh" from what was asked in the last second (the fetch then completes
        # without waiting, `DelayedRemoteFetch.complete_now`); off: every answer asks, as the tests drive it
        self.at_once = False
        self.purges: list[tuple[TopicIdPartition, int]] = []
        self.ready = True
        self._quota = quota or RemoteFetchQuota()
        self._remembered: dict[tuple[str, int], BrokerOffsets] = {}

    # --- building the tier ----------------------------------------------------------------------------------------
    def segment(self, tp: TopicIdPartition, first: int, last: int, per_batch: int = 10,
                value_bytes: int = 100) -> list[bytes]:
        """A finished segment of offsets first..last; returns its batches (what a read must serve, byte for byte)."""
        held = batches(first, last, per_batch, value_bytes)
        seg_id = os.urandom(16)
        md = RemoteLogSegmentMetadata(RemoteLogSegmentId(tp, seg_id), first, last, 1_000 + last, 0, 0, {0: first},
                                      sum(len(b) for b in held), SegmentState.COPY_SEGMENT_STARTED, False, None, 0)
        self.cache.apply(md)
        self.cache.apply_record(replace(md, state=SegmentState.COPY_SEGMENT_FINISHED))
        self.data[seg_id] = held
        return held

    def leader(self, topic: str, partition: int, log_start: int, high_watermark: int,
               last_stable: int | None = None) -> None:
        self.leaders[(topic, partition)] = BrokerOffsets(
            high_watermark, high_watermark if last_stable is None else last_stable, log_start, time.monotonic())

    # --- RemoteTierView -------------------------------------------------------------------------------------------
    @property
    def serving(self) -> bool:
        return self.ready

    @property
    def quota(self) -> RemoteFetchQuota:
        return self._quota

    def partition(self, topic: str, partition: int) -> PartitionCache | None:
        pc = self.cache.find(topic, partition)
        current = self.current_ids.get(topic)
        if pc is not None and current is not None and pc.tp.topic_id != current:
            return self.partition_by_id(current, partition)
        return pc

    def partition_by_id(self, topic_id: bytes, partition: int) -> PartitionCache | None:
        return self.cache.get(topic_id, partition)

    def learn_topic_ids(self, topics: Iterable[Mapping[str, Any]]) -> None:
        for t in topics:
            if t.get("name") and t.get("topic_id"):
                self.current_ids[t["name"]] = bytes(t["topic_id"])

    async def refresh_topic_ids(self, topics: set[str], max_age: float = 1.0) -> set[str]:
        """What a Metadata answer would say now: `ids_on_refresh` become the current ids (after `refresh_gate`);
        every topic but `unnamed_on_refresh` counts as named by the cluster."""
        self.refreshes += 1
        if self.refresh_gate is not None:
            await self.refresh_gate.wait()
        self.current_ids.update(self.ids_on_refresh)
        return set(topics) - self.unnamed_on_refresh

    def fresh_topic_ids(self, topics: set[str], max_age: float = 1.0) -> set[str]:
        return set(topics) - self.unnamed_on_refresh if self.at_once else set()

    def read_slots(self) -> int:
        return 0 if self.script.pool_full else self.script.slots

    def submit_read(self, pc: PartitionCache, offset: int, max_bytes: int, read_committed: bool,
                    deadline: float, min_one: bool = True, as_file: bool = False) -> asyncio.Task[ReadResult] | None:
        md = pc.segment_for_offset(offset)
        if md is None:
            return None
        if self.script.pool_full:
            raise PoolFull("remote log reader pool full (1 running, 0 queued)")
        self.reads.append((pc.tp.topic, pc.tp.partition, offset, max_bytes, min_one))
        script, held = self.script, self.data[md.segment_id.id]

        async def read() -> ReadResult:
            if script.gate is not None:
                await script.gate.wait()
            if script.failure is not None:
                raise script.failure
            out: list[bytes] = []
            size = 0
            for b in held:
                batch = next(iter_batches(b))
                if batch.last_offset < offset:
                    continue
                if size + len(b) > max_bytes and (out or not min_one):
                    break
                out.append(b)
                size += len(b)
            return ReadResult(b"".join(out), list(script.aborted) if read_committed else [])

        return asyncio.get_running_loop().create_task(read())

    async def offset_for_timestamp(self, pc: PartitionCache, ts: int, deadline: float | None = None
                                   ) -> tuple[int, int] | None:
        for md in sorted(pc.finished(), key=lambda m: m.start_offset):
            for b in self.data[md.segment_id.id]:
                for rec in next(iter_batches(b)).records():
                    if rec.timestamp >= ts:
                        return rec.offset, rec.timestamp
        return None

    async def broker_offsets(self, topic: str, partition: int, max_age: float = 1.0) -> BrokerOffsets:
        got = await self.broker_offsets_many([(topic, partition)], max_age)
        if (topic, partition) not in got:
            raise KeyError(f"{topic}-{partition}: leader not reachable")
        return got[(topic, partition)]

    async def broker_offsets_many(self, pairs: list[tuple[str, int]], max_age: float = 1.0
                                  ) -> dict[tuple[str, int], BrokerOffsets]:
        out = {k: o for k in pairs if (o := self.leaders.get(k)) is not None}
        self._remembered.update(out)
        return out

    def last_broker_offsets(self, topic: str, partition: int, max_age: float) -> BrokerOffsets | None:
        if max_age <= 1.0 and not self.at_once:  # what counts as fresh enough to answer at once: see `at_once`
            return None
        c = self._remembered.get((topic, partition))
        return c if c is not None and time.monotonic() - c.at < max_age else None

    async def put_log_start(self, tp: TopicIdPartition, log_start: int) -> None:
        self.purges.append((tp, log_start))
        self.cache.apply(RemoteLogStartOffset(tp, log_start, 0))
