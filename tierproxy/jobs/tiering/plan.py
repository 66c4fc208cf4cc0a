"""The driver's plan: which partitions to tier and the segment ranges to copy.

Per partition the range runs from (highest tiered offset + 1) — or the broker's log start when nothing is
tiered yet — up to the last stable offset, cut into ranges of about `segment.bytes` using the partition's bytes
per offset sampled from one fetch; holes a failed copy left between tiered segments are planned first. A gap
(log start above the tiered end + 1, or above a hole's start) is reported, never papered over. A compacted
topic is planned as any other: its removed offsets lie inside the ranges (`tier.rules.segment_range`).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

from protocol.constants import ApiKey
from protocol.records import iter_batches
from protocol.requests import fetch_request
from tierproxy.config.identity import ClientIdentity
from tierproxy.jobs.tiering.cluster import ClusterView, PartitionInfo, PartitionOffsets
from tierproxy.kafka.wireclient import WireClient
from tierproxy.tier.rules import lost_range, never_tiered, tombstones_at_risk

log = logging.getLogger("tierproxy.tier.plan")
SAMPLE_BYTES = 1 << 20


@dataclass(frozen=True)
class Gap:
    topic: str
    partition: int
    first_missing: int
    last_missing: int

    def describe(self) -> str:
        return (f"{self.topic}-{self.partition}: offsets {self.first_missing}..{self.last_missing} were deleted by "
                "the broker before they were tiered")


@dataclass(frozen=True)
class Range:
    part: PartitionInfo
    start: int
    end: int  # exclusive
    first: bool  # the partition's first range in this pass: takes the batch straddling `start`


def select_topics(view: ClusterView, pattern: str, exclude: str = "") -> list[PartitionInfo]:
    """Partitions of the topics `pattern` matches and `exclude` does not (internal topics never). Compacted topics
    (`cleanup.policy` compact or compact,delete) are tiered as the broker holds them, cleaned or not: their
    offset gaps lie inside the segments' ranges (`tier.rules.segment_range`)."""
    regex, excluded = re.compile(pattern), re.compile(exclude) if exclude else None
    chosen = []
    for p in view.partitions:
        if never_tiered(p.topic, p.topic in view.internal) or not regex.fullmatch(p.topic):
            continue
        if excluded is not None and excluded.fullmatch(p.topic):
            continue
        chosen.append(p)
    return chosen


def bytes_per_offset(leader: str, p: PartitionInfo, start: int, identity: ClientIdentity | None = None) -> float:
    with WireClient(leader, client_id="tierproxy-tier", identity=identity) as w:
        resp = w.request(ApiKey.FETCH, 12, fetch_request({p.topic: {p.partition: start}}, max_bytes=SAMPLE_BYTES))
    batches = list(iter_batches(resp["responses"][0]["partitions"][0]["records"]))
    if not batches:
        return 100.0
    span = int(batches[-1].last_offset - batches[0].base_offset + 1)
    return max(1.0, float(sum(b.size for b in batches)) / span)


def plan_partition(view: ClusterView, p: PartitionInfo, offsets: PartitionOffsets, tiered_end: int,
                   segment_bytes: int, holes: list[tuple[int, int]] | None = None,
                   purged_below: int = 0) -> tuple[list[Range], list[Gap]]:
    """Ranges to copy: first the `holes` between tiered segments (left by a failed copy), then from the tiered end
    to the last stable offset. What the broker deleted before it was copied is a gap, reported; what lies below
    a recorded purge (`purged_below`) was deleted on purpose and is neither copied nor a gap."""
    gaps: list[Gap] = []
    spans: list[tuple[int, int]] = []
    for a, b in [*(holes or []), (tiered_end + 1, offsets.last_stable)]:
        a = max(a, purged_below)
        if tiered_end >= 0 and (lost := lost_range(a, b, offsets.log_start)) is not None:
            gaps.append(Gap(p.topic, p.partition, *lost))
        lo, hi = max(a, offsets.log_start), min(b, offsets.last_stable)
        if lo < hi:
            spans.append((lo, hi))
    if not spans:
        return [], gaps
    per = max(1, int(segment_bytes / bytes_per_offset(view.leader_address(p), p, spans[0][0], view.identity)))
    ranges = []
    for start, end in spans:
        a = start
        while a < end:
            b = min(a + per, end)
            ranges.append(Range(p, a, b, first=a == start))
            a = b
    return ranges, gaps


def tombstone_risk(p: PartitionInfo, tiered_until_ms: int, delete_retention_ms: int, now_ms: int,
                   oldest_copied_ms: int = -1) -> str | None:
    """What a pass reports when a copy of compacted partition `p` met records the cleaner removed and the tier's
    newest record before the pass (`tiered_until_ms`; -1: nothing tiered, then the oldest record the copy found,
    `oldest_copied_ms`) is `delete.retention.ms` old or more: a tombstone removed meanwhile left the tier an older
    value of its key (`rules.tombstones_at_risk`). None: no risk seen."""
    since = tiered_until_ms if tiered_until_ms >= 0 else oldest_copied_ms
    if not tombstones_at_risk(since, now_ms, delete_retention_ms):
        return None
    what = f"the tier's newest is from {since}" if tiered_until_ms >= 0 else f"its oldest record is from {since}"
    return (f"{p.topic}-{p.partition}: copied records the broker's cleaner removed, and {what}: "
            f"delete.retention.ms={delete_retention_ms} may have passed since, so a tombstone removed meanwhile is not "
            "in the tier (tier compacted topics more often than delete.retention.ms)")
