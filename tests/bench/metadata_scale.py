"""A tier's metadata at scale, each step in a fresh process (its time and peak RSS its own):

    python -m tests.bench.metadata_scale write DIR SEGMENTS PARTITIONS   # the tier's snapshot, then passes of +100
    python -m tests.bench.metadata_scale plan DIR                        # what `restore` plans from: load + replay

The metadata is the compacted view a real tier's metadata topic holds (the records `RemoteLogMetadataManager`
writes, through the real serde): per partition SEGMENTS/PARTITIONS live segments (COPY_SEGMENT_FINISHED), the 20 %
of history retention deleted gone (their keys tombstoned, so not live) and the partition's log start recorded
above it (a RemoteLogStartOffset record, as a purge leaves). Each prints one JSON line."""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import time
from pathlib import Path

from tierproxy.tier.model import RemoteLogSegmentId, RemoteLogSegmentMetadata, RemoteLogStartOffset, SegmentState
from tierproxy.tier.model import TopicIdPartition as TIP
from tierproxy.tier.serde import encode_value, record_key
from tierproxy.tier.snapshot import PartitionFacts, SnapshotWriter, TierSnapshot, TopicFacts
from tierproxy.tier.storage import FileStore

TOPICS = 10
SEGMENT_OFFSETS = 1000


def _hwm_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM")


class Generated:
    """A tier of `segments` live segments over `partitions` partitions (of `TOPICS` topics)."""

    def __init__(self, segments: int, partitions: int, seed: int = 7) -> None:
        self.rng = random.Random(seed)
        per_topic = partitions // TOPICS
        self.tps = [TIP(f"t{t}", bytes([t + 1]) * 16, p) for t in range(TOPICS) for p in range(per_topic)]
        self.per = segments // len(self.tps)
        self.deleted = self.per // 4  # 20 % of all history: deleted below the log start
        self.ends = {t: (self.deleted + self.per) * SEGMENT_OFFSETS for t in self.tps}
        self.values: dict[bytes, bytes] = {}
        self.changed: dict[bytes, bytes | None] = {}
        for t in self.tps:
            start = self.deleted * SEGMENT_OFFSETS
            ls = RemoteLogStartOffset(t, start, 1)
            self.values[record_key(ls)] = encode_value(ls)
            for i in range(self.deleted, self.deleted + self.per):
                self._segment(t, i * SEGMENT_OFFSETS)

    def _segment(self, t: TIP, base: int) -> None:
        end = base + SEGMENT_OFFSETS - 1
        md = RemoteLogSegmentMetadata(RemoteLogSegmentId(t, self.rng.randbytes(16)), base, end, 1_700_000_000_000,
                                      1, 1_700_000_000_000, {0: base}, 1 << 30, SegmentState.COPY_SEGMENT_FINISHED,
                                      False, None, 1)
        self.values[record_key(md)] = value = encode_value(md)
        self.changed[record_key(md)] = value

    def take_changed(self) -> dict[bytes, bytes | None]:
        """What the metadata view tells the writer (`RemoteLogMetadataManager.take_changed`)."""
        taken, self.changed = self.changed, {}
        return taken

    def add(self, n: int) -> None:
        """A pass: `n` new segments on as many partitions."""
        for t in self.rng.sample(self.tps, n):
            self._segment(t, self.ends[t])
            self.ends[t] += SEGMENT_OFFSETS

    def snap(self, taken: int) -> TierSnapshot:
        topics = {f"t{t}": TopicFacts(f"t{t}", "x", "x", len(self.tps) // TOPICS, 3, {}) for t in range(TOPICS)}
        parts = [PartitionFacts(t.topic, t.partition, self.ends[t] + 10, self.deleted * SEGMENT_OFFSETS, 5)
                 for t in self.tps]
        return TierSnapshot("bench", taken, f"r{taken}", None, None, topics, parts, records=list(self.values.items()))


async def _write(root: Path, segments: int, partitions: int) -> dict[str, float]:
    gen = Generated(segments, partitions)
    writer = SnapshotWriter(FileStore(root), "", tracked=True)
    gen.take_changed()  # as a tier job's first pass: the view tracks changes from here
    began = time.perf_counter()
    await writer.write(gen.snap(1))
    base_s, base_bytes = time.perf_counter() - began, writer.last_bytes
    times, sizes = [], []
    for taken in range(2, 12):  # ten passes of 100 new segments each
        gen.add(100)
        changed, snap = gen.take_changed(), gen.snap(taken)
        began = time.perf_counter()
        await writer.write(snap, changed)
        times.append(time.perf_counter() - began)
        sizes.append(writer.last_bytes)
    return {"live": len(gen.values), "base_s": base_s, "base_bytes": base_bytes, "pass_s": sorted(times)[5],
            "pass_bytes": max(sizes), "rss_mib": _hwm_mib()}


async def _plan(root: Path) -> dict[str, float]:
    from tierproxy.jobs.restore.plan import choose_facts, replay
    from tierproxy.tier import snapshot as snapshots

    before = _hwm_mib()
    began = time.perf_counter()
    chosen = choose_facts(await snapshots.of_cluster(FileStore(root), ""))
    loaded = time.perf_counter() - began
    cache = replay(chosen.snapshot)
    segments = sum(len(pc.segments) for pc in cache.partitions.values())
    return {"seconds": time.perf_counter() - began, "load_s": loaded, "segments": segments,
            "rss_mib": _hwm_mib(), "rss_before_mib": before}


if __name__ == "__main__":
    what, where = sys.argv[1], Path(sys.argv[2])
    if what == "write":
        out = asyncio.run(_write(where, int(sys.argv[3]), int(sys.argv[4])))
    else:
        out = asyncio.run(_plan(where))
    print(json.dumps(out | {"pid": os.getpid()}))
