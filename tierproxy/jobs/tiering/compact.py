"""The compaction step of `tierproxy tier`: the tier cleans its compacted topics itself, with Kafka's LogCleaner
rules (`tier.compaction`, the engine), and records each cleaning as a replacement (`replace`, `tier.replacement`).

After the copies, for each tiered partition of a topic whose `cleanup.policy` holds `compact`: the driver plans
(`plan_cleaning` over the served segments), records COPY_SEGMENT_STARTED for each group's new segment, and runs one
Spark task per partition that needs it (partitions in parallel): the task reads the segments through the RSM, calls
`clean_partition` with its key map bounded by `tier.cleaner.dedupe.buffer.size`, uploads the new segments and
answers their facts. The driver then records each one finished, in offset order, and marks the segments it replaced
for deletion; a group the task did not clean (the key map filled, or the task failed) or whose segments are no longer
all served is rolled back with every group after it, and they wait for the next pass.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from tierproxy.jobs.tiering import replace as replacing
from tierproxy.jobs.tiering.cluster import PartitionInfo
from tierproxy.jobs.tiering.housekeeping import delete_segment
from tierproxy.tier.compaction import (
    CleanerConfig,
    CleaningPlan,
    SegmentInput,
    TierSegment,
    clean_partition,
    plan_cleaning,
)
from tierproxy.tier.compaction.kernel import PYTHON, RecordKernel
from tierproxy.tier.indexes import (
    AbortedTxn,
    SegmentFiles,
    decode_producer_snapshot,
    decode_txn_index,
    encode_leader_epochs,
    encode_producer_snapshot,
    encode_txn_index,
)
from tierproxy.tier.model import RemoteLogSegmentMetadata
from tierproxy.tier.replacement import cleaned, epochs_within
from tierproxy.tier.requests import added
from tierproxy.tier.rlmm import RemoteLogMetadataManager
from tierproxy.tier.rsm import IndexType, RemoteStorageManager
from tierproxy.tier.rules import cleaning_bound, compacted, served_segments

log = logging.getLogger("tierproxy.tier")


@dataclass
class CompactionSummary:
    """What a pass's compaction step did: partitions cleaned, and the replaced segments against the new ones."""

    partitions: int = 0
    segments_before: int = 0
    segments_after: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    failed: int = 0  # partitions whose task failed (their groups rolled back, cleaned at a later pass)
    stopped: int = 0  # groups cleaned but rolled back behind an earlier group not replaced (`CompactionStep._record`)
    seconds: float = 0.0
    storage: dict[str, Any] = field(default_factory=dict)  # the tasks' object-store requests (`tier.requests`)
    errors: list[str] = field(default_factory=list)

    def line(self) -> str:
        return (f"compacted {self.partitions} partitions: {self.segments_before} -> {self.segments_after} segments, "
                f"{self.bytes_before / 1e6:.1f} -> {self.bytes_after / 1e6:.1f} MB in {self.seconds:.1f}s"
                + (f", {self.failed} failed" if self.failed else "")
                + (f", {self.stopped} groups stopped behind one not replaced" if self.stopped else ""))


@dataclass
class CompactionTask:
    """One partition's cleaning, shipped to an executor: the plan, the old segments to read, and the STARTED
    metadata each group's new segment is uploaded under (in the plan's group order), plus a spare one for the
    second part of a group the key map filled inside (`CleanedSegment`: at most one per cleaning)."""

    storage: str
    plan: CleaningPlan
    config: CleanerConfig
    now_ms: int
    map_bytes: int
    olds: dict[bytes, RemoteLogSegmentMetadata]
    started: list[RemoteLogSegmentMetadata]
    spare: RemoteLogSegmentMetadata
    compiled: bool | None = None  # the engine's per-record loops: compiled when numba imports (None), or forced


def best_kernel(compiled: bool | None = None) -> RecordKernel:
    """The engine's per-record loops: `compiled` None, the compiled ones when numba imports (the `tier` extra),
    else the Python reference; True, the compiled ones or ImportError; False, the reference."""
    if compiled is False:
        return PYTHON
    try:
        from tierproxy.jobs.tiering.compaction_kernel import CompiledKernel
    except ImportError:
        if compiled:
            raise
        log.info("numba cannot be imported: the compaction runs the Python reference loops")
        return PYTHON
    return CompiledKernel()


@dataclass
class Cleaned:
    """A new segment uploaded: which group (its index in the plan), under which STARTED record, its facts."""

    group: int
    segment: replacing.NewSegment


@dataclass
class CompactionResult:
    task: CompactionTask
    cleaned: list[Cleaned] = field(default_factory=list)
    error: str = ""
    storage: dict[str, Any] = field(default_factory=dict)


def compacted_partitions(parts: list[PartitionInfo], configs: dict[str, dict[str, str]]) -> list[PartitionInfo]:
    """Of the partitions the pass tiers (`plan.select_topics`), those whose topic's cleanup.policy holds
    `compact` (alone or with `delete`)."""
    return [p for p in parts if compacted(configs.get(p.topic, {}))]


def tier_segments(served: Sequence[RemoteLogSegmentMetadata]) -> list[TierSegment]:
    """The served segments as the cleaner sees them (a replacement's are below the partition's cleaned point)."""
    return [TierSegment(md.segment_id.id, md.start_offset, md.end_offset, md.max_timestamp_ms,
                        md.segment_size_in_bytes, cleaned(md)) for md in served]


def empty_files(start: int, epochs: dict[int, int]) -> SegmentFiles:
    """The files of a new segment none of whose batches a cleaning kept: its range stays the tier's (no hole)."""
    return SegmentFiles([], b"", b"", encode_leader_epochs(epochs), encode_txn_index([]),
                        encode_producer_snapshot({}), start, start, -1, epochs)


def compact_task(task: CompactionTask) -> CompactionResult:
    """Run on an executor: read the plan's segments through the RSM, clean them, upload each new segment as the
    engine yields it (memory: the key map, the segments being read and one new segment)."""
    out = CompactionResult(task)
    ids = {ts.segment_id: i for i, group in enumerate(task.plan.groups) for ts in group}
    loop = asyncio.new_event_loop()  # the engine is synchronous: each read and upload runs to its end here
    rsm = RemoteStorageManager.from_uri(task.storage)

    def read(ts: TierSegment) -> SegmentInput:
        md = task.olds[ts.segment_id]
        log_bytes = loop.run_until_complete(rsm.fetch_log(md, 0))
        txn = loop.run_until_complete(rsm.fetch_index(md, IndexType.TRANSACTION))
        snap = loop.run_until_complete(rsm.fetch_index(md, IndexType.PRODUCER_SNAPSHOT))
        return SegmentInput(log_bytes, decode_txn_index(txn), decode_producer_snapshot(snap))

    def read_aborted(ts: TierSegment) -> list[AbortedTxn]:  # (the txn index alone: not the whole log once more)
        return decode_txn_index(loop.run_until_complete(rsm.fetch_index(task.olds[ts.segment_id],
                                                                        IndexType.TRANSACTION)))

    try:
        group = -1
        for seg in clean_partition(task.plan, read, task.now_ms, task.config, map_bytes=task.map_bytes,
                                   read_aborted=read_aborted, kernel=best_kernel(task.compiled)):
            if seg.replaces:
                group = ids[seg.replaces[0].segment_id]
                started = task.started[group]
            else:  # the rest of the segment the key map filled inside: the same group's second new segment
                started = task.spare
            olds = [task.olds[ts.segment_id] for ts in task.plan.groups[group]]
            files = seg.files or empty_files(seg.start_offset, epochs_within(olds, seg.start_offset, seg.end_offset))
            loop.run_until_complete(rsm.copy_segment(replace(started, start_offset=seg.start_offset), files))
            out.cleaned.append(Cleaned(group, replacing.NewSegment(started, seg.start_offset, seg.end_offset,
                                                                   seg.max_timestamp_ms, seg.size,
                                                                   files.txn_index_empty, seg.cleaned)))
    except Exception as exc:  # the driver rolls the partition's groups back and reports it
        out.error = f"{type(exc).__name__}: {exc}"
    finally:
        out.storage = rsm.store.counts.as_dict()
        loop.run_until_complete(rsm.close())
        loop.close()
    return out


class CompactionStep:
    """The driver's side of one pass's compaction (`run`), on the tier job's RLMM loop and Spark session."""

    def __init__(self, rlmm: RemoteLogMetadataManager, rsm: RemoteStorageManager, storage: str, map_bytes: int,
                 run: Any, spark: Any | None, segment_bytes: Callable[[str], int] | None = None) -> None:
        """`run`: runs a coroutine on the RLMM's loop; `spark`: the job's session (`JobSpark`), or None to run the
        tasks in this process one after another (a driver without Spark: tests, tools); `segment_bytes`: a topic's
        tier segment size (`tier.segment.bytes`, its override), which bounds the new segments (and a task's memory)
        below the topic's own segment.bytes."""
        self.rlmm, self.rsm, self.storage, self.map_bytes = rlmm, rsm, storage, map_bytes
        self.segment_bytes = segment_bytes
        self._run, self._spark = run, spark

    def run(self, parts: list[PartitionInfo], configs: dict[str, dict[str, str]],
            stable: dict[tuple[str, int], int],
            log_starts: dict[tuple[str, int], int] | None = None) -> CompactionSummary:
        """Clean the partitions `parts` that need it; `stable`: (topic, partition) → its last stable offset;
        `log_starts`: → the broker's log start (unknown: every hole between tier segments bounds the cleaning,
        `rules.cleaning_bound`)."""
        summary = CompactionSummary()
        began = time.monotonic()
        now = int(time.time() * 1000)
        tasks = []
        for p in parts:
            pc = self.rlmm.cache.get(p.topic_id, p.partition)
            if pc is None:
                continue
            served = served_segments(pc.finished(), pc.log_start_offset)
            try:
                config = CleanerConfig.from_topic_configs(configs.get(p.topic, {}))
                if self.segment_bytes is not None:
                    config = dataclasses.replace(config, segment_bytes=min(config.segment_bytes,
                                                                           self.segment_bytes(p.topic)))
                key = (p.topic, p.partition)
                bound = cleaning_bound(pc.holes(), (log_starts or {}).get(key), stable.get(key))
                plan = plan_cleaning(tier_segments(served), now, config, last_stable_offset=bound)
            except Exception as exc:  # this partition waits (served as it is); the pass goes on
                log.error("%s-%d not compacted: %s", p.topic, p.partition, exc)
                summary.errors.append(f"{p.topic}-{p.partition} not compacted: {type(exc).__name__}: {exc}")
                continue
            if plan is None or not plan.groups:
                continue
            olds = {md.segment_id.id: md for md in served}
            groups = [[olds[ts.segment_id] for ts in group] for group in plan.groups]
            started: list[RemoteLogSegmentMetadata] = []
            try:
                for group in [*groups, groups[-1]]:  # (the last: the spare)
                    started.append(self._run(replacing.start(self.rlmm, group)))
            except ValueError as exc:  # a group no replacement may take: this partition waits, the pass goes on
                for md in started:
                    self._run(delete_segment(self.rlmm, self.rsm, md))
                log.error("%s-%d not compacted: %s", p.topic, p.partition, exc)
                summary.errors.append(f"{p.topic}-{p.partition} not compacted: {exc}")
                continue
            spare = started.pop()
            tasks.append(CompactionTask(self.storage, plan, config, now, self.map_bytes, olds, started, spare))
        if not tasks:
            return summary
        if self._spark is None:
            results = [compact_task(t) for t in tasks]
        else:
            sc = self._spark().sparkContext
            results = sc.parallelize(tasks, len(tasks)).map(functools.partial(compact_task)).collect()
        for result in results:
            summary.storage = added(summary.storage, result.storage)
            self._record(result, summary)
        self._run(replacing.retire_shadowed(self.rlmm))
        summary.seconds = time.monotonic() - began
        return summary

    def _record(self, result: CompactionResult, summary: CompactionSummary) -> None:
        task = result.task
        if result.error:
            summary.failed += 1
            summary.errors.append(f"compaction of {task.started[0].tp} failed: {result.error}")
            log.error("compaction of %s failed: %s (rolled back; the next pass tries again)",
                      task.started[0].tp, result.error)
        news: dict[int, list[Cleaned]] = {}
        for c in [] if result.error else result.cleaned:
            news.setdefault(c.group, []).append(c)
        used = {c.segment.started.segment_id.id for group in news.values() for c in group}
        replaced = False
        for started in [*task.started, task.spare]:  # not cleaned this time (the key map filled, the task failed)
            if started.segment_id.id not in used:
                self._run(delete_segment(self.rlmm, self.rsm, started))
        # Groups are replaced in offset order, and the first one not replaced (not cleaned, or its finish rolled
        # back) stops the later ones, as Kafka's Cleaner.clean stops at its first failure: a later group's cleaning
        # may have removed what only an earlier group's cleaning made safe to remove (a tombstone past its delete
        # horizon whose key's older value the earlier group still holds, a transaction marker whose records it
        # still holds); replaced alone, it would bring a deleted key back or leave records without their marker.
        stop: list[RemoteLogSegmentMetadata] | None = None  # the first group not replaced
        stopped = 0
        for i, ts_group in enumerate(task.plan.groups):
            group = [task.olds[ts.segment_id] for ts in ts_group]
            segs = [c.segment for c in news.get(i, [])]
            if stop is not None or not segs:
                stop = stop or group
                if segs:
                    self._run(replacing.roll_back(self.rlmm, self.rsm, segs))
                    stopped += 1
                continue
            # the key map filled inside the group: the new segments replace the segments they reach, the rest
            # of the group stays as it is
            reach = max(n.end_offset for n in segs)
            group = [md for md in group if md.start_offset <= reach]
            done = self._run(replacing.finish(self.rlmm, self.rsm, group, segs))
            if done is None:
                stop = group
                continue
            summary.segments_before += len(group)
            summary.segments_after += len(done)
            summary.bytes_before += sum(g.segment_size_in_bytes for g in group)
            summary.bytes_after += sum(n.size for n in segs)
            replaced = True
        if stop is not None and stopped:
            summary.stopped += stopped
            log.warning("%s: the %d cleaned groups after %d..%d rolled back, as it was not replaced (groups are "
                        "replaced in order); the next pass cleans them again", task.started[0].tp, stopped,
                        stop[0].start_offset, stop[-1].end_offset)
        if replaced:
            summary.partitions += 1
