"""The executor side: copy one planned segment range from the partition leader to remote storage.

Raw record batches are fetched with the `protocol` package (READ_COMMITTED up to the last stable offset, so the
broker also reports aborted transactions; control batches are kept) and stored exactly as served — never
decoded or re-compressed. A segment holds the whole batches with `start ≤ base offset < end`; the first range
of a partition also takes the batch straddling its start.

A segment's range is the range planned, not its batches' (`tier.rules.segment_range`), as a broker's segment
runs from its base offset to the next one's: offsets a compacted log no longer holds at its start or end (the
log cleaner removed them) are the segment's too, so the tier stays contiguous and compaction is never a hole.
A range whose every offset was compacted away is covered by a segment of no batches (`indexes.empty_segment`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from protocol.constants import ApiKey, ErrorCode, IsolationLevel
from protocol.records import RecordBatch, iter_batches
from protocol.requests import fetch_request
from tierproxy.config.identity import ClientIdentity
from tierproxy.kafka.wireclient import WireClient
from tierproxy.tier.indexes import SegmentBuilder, empty_segment
from tierproxy.tier.model import (
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    SegmentState,
    TopicIdPartition,
    TransactionOutcome,
)
from tierproxy.tier.rsm import RemoteStorageManager
from tierproxy.tier.rules import segment_range
from tierproxy.tier.transactions import copied_outcomes

FETCH_VERSION = 12
FETCH_BY_ID_VERSION = 13
FETCH_MAX_BYTES = 8 << 20


class CopyError(RuntimeError):
    """A copy task failed (broker error, storage error); the driver retries with a new segment id."""


class LeaderMoved(CopyError):
    """The broker asked is no longer (or not yet) the partition's leader, or cannot be reached: the driver waits
    for the cluster to name a live leader and retries there."""


LEADER_ERRORS = frozenset({ErrorCode.LEADER_NOT_AVAILABLE, ErrorCode.NOT_LEADER_OR_FOLLOWER,
                           ErrorCode.REPLICA_NOT_AVAILABLE, ErrorCode.FENCED_LEADER_EPOCH,
                           ErrorCode.UNKNOWN_LEADER_EPOCH})


class BehindPlan(CopyError):
    """The leader's stable end is below a range planned under its earlier stable end: a new leader that has not
    yet advanced its high watermark over what the old one had committed. The driver waits until it has, then
    retries — never taken as "nothing to copy"."""


class DataGone(CopyError):
    """The broker no longer has the range (OFFSET_OUT_OF_RANGE): retrying cannot help; the next pass reports
    the gap and starts from the broker's log start."""


def iter_fetch(leader: str, topic: str, partition: int, start: int, end: int, *,
               isolation: int = IsolationLevel.READ_COMMITTED, client_id: str = "tierproxy-tier",
               identity: ClientIdentity | None = None, topic_id: bytes | None = None, planned: bool = False,
               beyond: list[RecordBatch] | None = None
               ) -> Iterator[tuple[list[RecordBatch], list[tuple[int, int]]]]:
    """Raw batches from `start` up to `end` (or the last stable offset / high watermark, by `isolation`), one
    fetch response at a time, with the aborted transactions (producer id, first offset) that response reports.
    The first batch may begin before `start` (the one holding it). With `topic_id` the topic is fetched by id
    (Fetch v13): a topic deleted and created again under its name answers UNKNOWN_TOPIC_ID, not the new data.
    A `planned` range lies below a stable end the leader reported before: a stable end below it now raises
    `BehindPlan` instead of ending the range short. Offsets with no batch (a compacted log's) are passed over as
    the broker passes over them: an answer that starts at or past `end`, or an empty one up to a stable end at or
    past it, ends the range. `beyond` gets the first batch served past `end`, if one was."""
    offset = start
    version = FETCH_BY_ID_VERSION if topic_id else FETCH_VERSION
    ids = {topic: topic_id} if topic_id else None
    with WireClient(leader, client_id=client_id, timeout=60, identity=identity) as w:
        while offset < end:
            resp = w.request(ApiKey.FETCH, version, fetch_request({topic: {partition: offset}}, topic_ids=ids,
                                                                  max_bytes=FETCH_MAX_BYTES, isolation=isolation))
            part = resp["responses"][0]["partitions"][0]
            if part["error_code"] == ErrorCode.OFFSET_OUT_OF_RANGE:
                raise DataGone(f"{topic}-{partition}: offset {offset} is no longer on the broker")
            if part["error_code"] == ErrorCode.UNKNOWN_TOPIC_ID:
                raise DataGone(f"{topic}-{partition}: topic id {topic_id.hex() if topic_id else '?'} is gone "
                               "(the topic was deleted, or deleted and created again)")
            if part["error_code"] in LEADER_ERRORS:
                raise LeaderMoved(f"{topic}-{partition}: {leader} answered error {part['error_code']} (not leader)")
            if part["error_code"] != 0:
                raise CopyError(f"{topic}-{partition} fetch at {offset}: error {part['error_code']}")
            aborted = [(a["producer_id"], a["first_offset"]) for a in part["aborted_transactions"] or []]
            served = list(iter_batches(part["records"]))
            batches = [b for b in served if b.last_offset >= offset and b.base_offset < end]
            if batches:
                offset = batches[-1].last_offset + 1
                yield batches, aborted
            limit = part["last_stable_offset"] if isolation == IsolationLevel.READ_COMMITTED else part["high_watermark"]
            if served and served[-1].base_offset >= end:  # batches ascend: the last tells if `end` was passed
                if beyond is not None:
                    beyond += [b for b in served if b.base_offset >= end][:1]
                return
            if not batches:
                # a broker answers at least one batch when one lies below its stable end (KIP-74): none means no
                # batch from `offset` up to it (a compacted log's removed offsets), not a batch too big to answer
                if planned and offset < end and limit < end:
                    raise BehindPlan(f"{topic}-{partition}: {leader} says the stable end is {limit}, below the "
                                     f"planned range's end {end} (a new leader catching up)")
                return


@dataclass
class Fetched:
    """What a copy fetched for [start, end): the whole batches it keeps, the aborted transactions (producer id,
    first offset) around them, the last offset of a batch straddling `start` that the previous range took (-1:
    none), and the first batch the broker holds past `end` (None: none below its stable end)."""

    batches: list[memoryview]
    aborted: list[tuple[int, int]]
    taken_before: int = -1
    next_batch: RecordBatch | None = None


def fetch_covering(leader: str, topic: str, partition: int, start: int, end: int, first: bool,
                   identity: ClientIdentity | None = None, topic_id: bytes | None = None) -> Fetched:
    """`fetch_range` with what the segment's range needs besides its batches (`Fetched`)."""
    batches: list[memoryview] = []
    aborted: set[tuple[int, int]] = set()
    beyond: list[RecordBatch] = []
    taken_before = -1
    for got, txns in iter_fetch(leader, topic, partition, start, end, identity=identity, topic_id=topic_id,
                                planned=True, beyond=beyond):
        aborted |= set(txns)
        for b in got:
            if b.base_offset >= start or (first and not batches):
                batches.append(b.view())
            else:
                taken_before = b.last_offset
    return Fetched(batches, sorted(aborted), taken_before, beyond[0] if beyond else None)


def fetch_range(leader: str, topic: str, partition: int, start: int, end: int, first: bool,
                identity: ClientIdentity | None = None, topic_id: bytes | None = None
                ) -> tuple[list[memoryview], list[tuple[int, int]]]:
    """Whole batches for [start, end) and the aborted transactions (producer id, first offset) around them."""
    got = fetch_covering(leader, topic, partition, start, end, first, identity, topic_id)
    return got.batches, got.aborted


@dataclass(frozen=True)
class CopyTask:
    """One segment to copy, as the driver ships it to an executor (pickled: plain values only, no secrets)."""

    leader: str | None  # HOST:PORT of the partition's leader when planned
    topic: str
    topic_id: bytes
    partition: int
    start: int  # [start, end): the offsets planned
    end: int
    first: bool  # the first range after the tier's end: a batch straddling `start` is kept
    segment_id: bytes
    storage: str
    fetch_topic_id: bytes | None = None  # the cluster's id when it is not `topic_id` (a restored topic)


@dataclass(frozen=True)
class CopyResult:
    """What an executor answers: the copied segment's facts, or why it was not copied."""

    task: CopyTask
    ok: bool
    empty: bool = False  # nothing below the LSO in the range after all
    start_offset: int = -1
    end_offset: int = -1
    max_timestamp_ms: int = -1
    leader_epochs: dict[int, int] = field(default_factory=dict)
    size: int = 0
    txn_index_empty: bool = True
    seconds: float = 0.0
    outcomes: list[TransactionOutcome] = field(default_factory=list)  # of transactions open at the segment's end
    removed: int = 0  # offsets of the segment's range holding no record (a compacted log's)
    oldest_ms: int = -1  # the oldest batch's max timestamp copied (-1: none)
    gone: bool = False  # the broker no longer holds the range (a gap, reported by the next pass)
    leader_moved: bool = False  # refused, reset or timed out: retried at the partition's next leader
    behind: bool = False  # the leader's stable end is below the plan: retried once it has caught up
    error: str = ""
    storage: dict[str, Any] = field(default_factory=dict)  # the requests the copy sent (`tier.requests`)


def copy_task(task: CopyTask, identity: ClientIdentity | None = None) -> CopyResult:
    """Run on an executor: fetch, build indexes, upload. Returns the segment facts or the error.

    `identity` (tierproxy's own, secrets and key material included) comes bound to the function Spark ships, never
    in the tasks that come back to the driver and its summaries."""
    started = time.monotonic()
    sent: dict[str, Any] = {}
    try:
        if not task.leader:
            raise LeaderMoved(f"{task.topic}-{task.partition} has no leader the cluster can name")
        got = fetch_covering(task.leader, task.topic, task.partition, task.start, task.end, task.first, identity,
                             task.fetch_topic_id or task.topic_id)
        aborted = got.aborted
        batches = [next(iter_batches(view)) for view in got.batches]
        first, last = segment_range(task.start, task.end, got.taken_before, batches[0] if batches else None,
                                    batches[-1] if batches else None)
        if first > last:  # the batch straddling `start` that the previous range took covers all of it
            return CopyResult(task, ok=True, empty=True)
        if batches:
            builder = SegmentBuilder(txn_starts=aborted, base_offset=first)
            for batch in batches:
                builder.add(batch)
            files = builder.finish(end_offset=last)
        elif got.next_batch is not None:  # every offset of the range compacted away: covered all the same
            files = empty_segment(first, last, got.next_batch.partition_leader_epoch, aborted)
        else:  # nothing up to the stable end: the next pass's range starts here and covers it
            return CopyResult(task, ok=True, empty=True)
        removed = (last - first + 1) - sum(b.records_count for b in batches)
        tp = TopicIdPartition(task.topic, task.topic_id, task.partition)
        md = RemoteLogSegmentMetadata(RemoteLogSegmentId(tp, task.segment_id), files.start_offset,
                                      files.end_offset, files.max_timestamp_ms, -1, 0,
                                      files.leader_epochs or {0: files.start_offset}, files.log_size,
                                      SegmentState.COPY_SEGMENT_STARTED, files.txn_index_empty)

        async def upload() -> None:
            rsm = RemoteStorageManager.from_uri(task.storage)
            try:
                await rsm.copy_segment(md, files)
            finally:
                sent.update(rsm.store.counts.as_dict())
                await rsm.close()

        asyncio.run(upload())
        # its marker lies above the copy: the outcome the same fetch reported is the tier's to keep
        open_at_end = {pid: e.current_txn_first_offset for pid, e in files.producers.items()
                       if e.current_txn_first_offset >= 0}
        return CopyResult(task, ok=True, start_offset=files.start_offset, end_offset=files.end_offset,
                          max_timestamp_ms=files.max_timestamp_ms,
                          leader_epochs=files.leader_epochs or {0: files.start_offset}, size=files.log_size,
                          txn_index_empty=files.txn_index_empty, seconds=time.monotonic() - started,
                          removed=max(0, removed),
                          oldest_ms=min((b.max_timestamp for b in batches if b.max_timestamp >= 0), default=-1),
                          outcomes=copied_outcomes(tp, open_at_end, aborted, int(time.time() * 1000)), storage=sent)
    except Exception as exc:  # the driver decides: retry with a new segment id
        moved = isinstance(exc, (LeaderMoved, OSError))  # refused, reset or timed out: the leader may be gone
        return CopyResult(task, ok=False, gone=isinstance(exc, DataGone), leader_moved=moved,
                          behind=isinstance(exc, BehindPlan),
                          error=f"{type(exc).__name__}: {exc}", storage=sent)
