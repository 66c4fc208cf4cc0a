"""A restore drill: what a restore of the tier would lose now, checked without changing anything.

`tierproxy restore --dry-run` plans as a restore would and then reads the tier the way a restore would rely on it:
every served segment's objects are listed and its log's head read (an object missing, or a log shorter or longer
than its metadata says, is a segment no restore could serve), and the plan's facts give what would be lost — per
partition the offsets the tier does not hold, [N, S) as the snapshot recorded it or, run against the live cluster
itself, [N, its high watermark now). Run on a schedule against the live tier it is an alert on the recovery point
(`--metrics-file`: Prometheus' text format, for node_exporter's textfile collector; alert rules in the chart).
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tierproxy.jobs.restore.plan import TopicPlan
from tierproxy.tier.cache import MetadataCache
from tierproxy.tier.model import uuid_str
from tierproxy.tier.rsm import LOG_EXT, IndexType, RemoteStorageManager
from tierproxy.tier.storage import ObjectMissing
from tierproxy.tier.transactions import lost_outcomes

HEADS_IN_FLIGHT = 32  # object heads asked at once: a drill over a large tier stays a bounded load on the store
OBJECT_EXTS = (LOG_EXT, *(i.value for i in IndexType))


@dataclass
class DrillFindings:
    """What a restore now would find in the tier, and what it would lose."""

    segments: int = 0  # served segments checked
    objects: int = 0  # objects found for them
    broken: list[str] = field(default_factory=list)  # why a segment could not be served: missing or wrong-sized
    lost: dict[tuple[str, int], tuple[int, int]] = field(default_factory=dict)  # (topic, partition) → [N, end)
    open_transactions: int = 0  # transactions a restore would resolve as aborted (open at the pass)
    unrecorded: list[str] = field(default_factory=list)  # facts the snapshot could not read (groups, partitions)
    snapshot_age_s: float = 0.0

    @property
    def lost_offsets(self) -> int:
        return sum(end - start for start, end in self.lost.values())

    def lines(self) -> list[str]:
        out = [f"  drill: {self.segments} served segments, {self.objects} objects found, "
               f"{len(self.broken)} broken; snapshot {self.snapshot_age_s:.0f}s old; "
               f"{self.lost_offsets} offsets would be lost"
               + (f"; {self.open_transactions} open transactions would be aborted" if self.open_transactions else "")]
        out += [f"  drill: BROKEN {why}" for why in self.broken[:20]]
        if len(self.broken) > 20:
            out.append(f"  drill: ... and {len(self.broken) - 20} more broken segments")
        out += [f"  drill: NOT RECORDED {what}" for what in self.unrecorded]
        return out


async def check_objects(rsm: RemoteStorageManager, history: MetadataCache, topics: set[str]) -> DrillFindings:
    """List each partition's objects once, then read the head of every served segment's log (its size)."""
    found = DrillFindings()
    gate = asyncio.Semaphore(HEADS_IN_FLIGHT)

    async def log_size(key: str) -> int | None:
        async with gate:
            try:
                return await rsm.store.size(key)
            except ObjectMissing:
                return None

    for (tid, part), pc in sorted(history.partitions.items(), key=lambda kv: (kv[1].tp.topic, kv[0][1])):
        if pc.tp.topic not in topics or history.is_deleted(tid, part):
            continue
        prefix = rsm.object_key(f"{pc.tp.topic}-{uuid_str(tid)}/{part}/")
        keys = set(await rsm.store.list(prefix))
        segments = list(pc.finished())
        sizes = await asyncio.gather(*(log_size(rsm.key(md, LOG_EXT)) for md in segments))
        for md, size in zip(segments, sizes, strict=True):
            found.segments += 1
            wanted = [rsm.key(md, ext) for ext in OBJECT_EXTS]
            missing = [k.rsplit(".", 1)[-1] for k in wanted if k not in keys]
            found.objects += len(wanted) - len(missing)
            what = f"{pc.tp.topic}-{part} segment {md.start_offset}..{md.end_offset}"
            if missing:
                found.broken.append(f"{what}: missing {', '.join(missing)}")
            elif size != md.segment_size_in_bytes:
                found.broken.append(f"{what}: its log holds {size} bytes, its metadata says "
                                    f"{md.segment_size_in_bytes}")
    return found


def _labels(topic: str, partition: int | None = None) -> str:
    esc = topic.replace("\\", "\\\\").replace('"', '\\"')
    return f'{{topic="{esc}"}}' if partition is None else f'{{topic="{esc}",partition="{partition}"}}'


def prometheus_text(f: DrillFindings, now_s: float) -> str:
    """The drill's findings as Prometheus' text exposition format (what a textfile collector reads)."""
    rows: list[tuple[str, str, list[tuple[str, float | int]]]] = [
        ("tierproxy_restore_drill_timestamp_seconds", "When the drill ran.", [("", now_s)]),
        ("tierproxy_restore_drill_snapshot_age_seconds", "Age of the tier snapshot a restore would plan from.",
         [("", f.snapshot_age_s)]),
        ("tierproxy_restore_drill_segments", "Served segments the drill checked.", [("", f.segments)]),
        ("tierproxy_restore_drill_broken_segments", "Served segments with an object missing or of the wrong size.",
         [("", len(f.broken))]),
        ("tierproxy_restore_drill_unrecorded_facts", "Facts the snapshot could not read (groups, partitions).",
         [("", len(f.unrecorded))]),
        ("tierproxy_restore_drill_open_transactions", "Transactions open at the pass: aborted by a restore.",
         [("", f.open_transactions)]),
        ("tierproxy_restore_drill_lost_offsets", "Offsets a restore now would lose, per partition.",
         [(_labels(t, p), end - start) for (t, p), (start, end) in sorted(f.lost.items())]),
    ]
    out = []
    for name, help_text, samples in rows:
        out += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
        out += [f"{name}{labels} {value:g}" if isinstance(value, float) else f"{name}{labels} {value}"
                for labels, value in samples]
    return "\n".join(out) + "\n"


def write_metrics(path: Path, text: str) -> None:
    """Written whole (a temporary file renamed): a collector never reads half a drill."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as out:
        out.write(text)
    os.replace(tmp, path)


async def drill(rsm: RemoteStorageManager, history: MetadataCache, plans: list[TopicPlan],
                live_ends: Mapping[tuple[str, int], int] | None, unrecorded: list[str], snapshot_taken_ms: int,
                now_ms: int) -> DrillFindings:
    """The drill over the planned topics: their objects (`check_objects`), the offsets a restore now would lose —
    [N, S) as planned, or [N, the high watermark now) when run against the live cluster (`live_ends`) — the
    transactions it would abort by rule (`tier.transactions.lost_outcomes`) and the facts no snapshot holds."""
    found = await check_objects(rsm, history, {plan.facts.name for plan in plans})
    for plan in plans:
        for pp in plan.partitions:
            end = pp.start if live_ends is None else max(pp.start, live_ends.get((pp.topic, pp.partition), 0))
            if end > pp.tier_end:
                found.lost[(pp.topic, pp.partition)] = (pp.tier_end, end)
            pc = history.get(plan.origin_id, pp.partition)
            if pc is not None:
                found.open_transactions += len(await lost_outcomes(pc, rsm, now_ms))
    found.unrecorded = list(unrecorded)
    found.snapshot_age_s = max(0.0, (now_ms - snapshot_taken_ms) / 1000)
    return found
