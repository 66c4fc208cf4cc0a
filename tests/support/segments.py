"""Building blocks for tier tests: partitions, segment metadata."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path

from tierproxy.tier.indexes import build_segment
from tierproxy.tier.model import (
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    SegmentState,
    TopicIdPartition,
)
from tierproxy.tier.rlmm import RemoteLogMetadataManager, new_segment, transition
from tierproxy.tier.rsm import RemoteStorageManager
from tierproxy.tier.storage import FileStore

S = SegmentState


def tp(topic: str = "orders", partition: int = 0, topic_id: bytes | None = None) -> TopicIdPartition:
    return TopicIdPartition(topic, topic_id or os.urandom(16), partition)


def seg(tip: TopicIdPartition, start: int, end: int, epochs: dict[int, int] | None = None, *,
        broker_epoch: int = 0, seg_id: bytes | None = None, ts: int = 1_000) -> RemoteLogSegmentMetadata:
    return RemoteLogSegmentMetadata(RemoteLogSegmentId(tip, seg_id or os.urandom(16)), start, end, ts + end, 101,
                                    ts, epochs or {0: start}, (end - start + 1) * 100,
                                    SegmentState.COPY_SEGMENT_STARTED, False, None, broker_epoch)


class Partition:
    """A partition's log as batches (base offset, last offset) and the tier job's rules for copying it."""

    def __init__(self, batch_sizes: list[int]) -> None:
        self.batches: list[tuple[int, int]] = []
        base = 0
        for n in batch_sizes:
            self.batches.append((base, base + n - 1))
            base += n
        self.end = base  # the last stable offset

    def copied(self, start: int, end: int, first: bool) -> tuple[int, int] | None:
        """The offsets a copy of [start, end) holds (copy.fetch_range's rule), None: empty."""
        held = [b for b in self.batches if start <= b[0] < end or (first and b[0] < start <= b[1])]
        return (held[0][0], held[-1][1]) if held else None


async def one_pass(r: RemoteLogMetadataManager, t: TopicIdPartition, log: Partition, per: int, failing: set[int],
                   expire: int) -> None:
    """One tiering pass as the tier job makes it, at the RLMM: holes first, then up to the log's end, cut every
    `per` offsets; the ranges numbered in `failing` fail and are discarded, empty ones deleted; then retention
    deletes the `expire` oldest segments."""
    pc = r.cache.get(t.topic_id, t.partition)
    tiered_end = pc.latest_tiered_offset() if pc else -1
    spans = [*(pc.holes() if pc else []), (tiered_end + 1, log.end)]
    ranges = []
    for a, b in spans:
        for lo in range(a, b, per):
            ranges.append((lo, min(lo + per, b), lo == a))
    planned = [new_segment(t, os.urandom(16), lo, hi - 1, -1, {0: lo}, 0) for lo, hi, _ in ranges]
    if planned:
        await r.add_segments(planned)
    for i, ((lo, hi, first), md) in enumerate(zip(ranges, planned, strict=True)):
        got = log.copied(lo, hi, first)
        if i in failing or got is None:  # failed, or empty: deleted as the job deletes a discarded copy
            await r.update_segment(transition(md, S.DELETE_SEGMENT_STARTED))
            await r.update_segment(transition(md, S.DELETE_SEGMENT_FINISHED))
            continue
        facts = RemoteLogSegmentMetadata(md.segment_id, got[0], got[1], 1000 + got[1], -1, 0, {0: got[0]},
                                         (got[1] - got[0] + 1) * 10, S.COPY_SEGMENT_FINISHED)
        await r.finish_copy(facts)
    pc = r.cache.get(t.topic_id, t.partition)
    for md in list(pc.finished())[:expire] if pc else []:  # retention: the oldest segments go
        await r.update_segment(transition(md, S.DELETE_SEGMENT_STARTED))
        await r.update_segment(transition(md, S.DELETE_SEGMENT_FINISHED))


async def stored_segment(rsm: RemoteStorageManager, raw: bytes, topic: str) -> RemoteLogSegmentMetadata:
    """Log bytes `raw` copied into `rsm` as a segment of a partition of `topic`, with its Kafka indexes."""
    files = build_segment(raw)
    md = dataclasses.replace(seg(tp(topic), files.start_offset, files.end_offset), segment_size_in_bytes=len(raw),
                             txn_index_empty=files.txn_index_empty)
    await rsm.copy_segment(md, files)
    return md


async def file_tier(root: Path, topic: str, segment: Callable[[list[int], int], bytes]
                    ) -> tuple[RemoteStorageManager, list[RemoteLogSegmentMetadata]]:
    """Two segments in a file:// tier under `root`: `segment(sizes, base offset)` makes each one's batches (sizes of
    1..40 records, so batch boundaries fall anywhere), with their Kafka indexes."""
    rsm = RemoteStorageManager(FileStore(root), "c")
    mds, base = [], 0
    for i in range(2):
        md = await stored_segment(rsm, segment([1 + (j * 7 + i) % 40 for j in range(120)], base), topic)
        mds.append(md)
        base = md.end_offset + 1
    return rsm, mds
