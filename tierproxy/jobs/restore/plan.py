"""What a restore does to each partition, decided before anything changes (pure: facts in, plan or refusal out).

A restored partition begins where the lost one ended: at S = max(the tier's end N, the high watermark recorded at
the last pass, the highest offset a group committed). Offsets [N, S) were produced after the last pass and are
lost: reported, never reused (a group that had read past N must not see those offsets name other records). The
new cluster's leader epoch is raised above every epoch the history used (the tier's segments, the recorded leader
epoch, the groups' committed epochs), so the lineage stays monotonic across the two clusters.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from tierproxy.tier.cache import MetadataCache
from tierproxy.tier.model import uuid_bytes
from tierproxy.tier.rlmm import ReplayedMetadata
from tierproxy.tier.snapshot import TierSnapshot, TopicFacts


class RestoreRefused(RuntimeError):
    """A restore that would lose or overwrite data, or cannot keep offsets: nothing was changed."""


@dataclass(frozen=True)
class PartitionPlan:
    topic: str
    partition: int
    tier_end: int  # N: the first offset the tier does not hold (0: it holds nothing)
    recorded_high_watermark: int
    group_max: int  # the highest committed offset of any group (-1: none)
    start: int  # S: where the restored partition begins
    min_epoch: int  # the leader epoch must end above this

    @property
    def lost(self) -> tuple[int, int] | None:
        """[N, S): produced after the last pass, gone with the cluster."""
        return (self.tier_end, self.start) if self.start > self.tier_end else None


@dataclass
class TopicPlan:
    facts: TopicFacts
    partitions: list[PartitionPlan] = field(default_factory=list)

    @property
    def origin_id(self) -> bytes:
        return uuid_bytes(self.facts.topic_id)


@dataclass(frozen=True)
class TargetPartition:
    """A partition of the topic as it stands in the new cluster (absent topics have none)."""

    log_start: int
    high_watermark: int


def replay(snap: TierSnapshot) -> MetadataCache:
    """The tier's view from the snapshot's records alone (no metadata topic)."""
    return ReplayedMetadata.of(snap.records).cache


def plan_topics(snap: TierSnapshot, cache: MetadataCache, pattern: str) -> list[TopicPlan]:
    """Per tiered topic of the snapshot whose name matches `pattern`: S and the epoch floor per partition."""
    rx = re.compile(pattern)
    recorded = {(p.topic, p.partition): p for p in snap.partitions}
    groups: dict[tuple[str, int], tuple[int, int]] = {}
    for offsets in snap.groups.values():
        for o in offsets:
            off, ep = groups.get((o.topic, o.partition), (-1, -1))
            groups[(o.topic, o.partition)] = (max(off, o.offset), max(ep, o.leader_epoch))
    plans = []
    for name, facts in sorted(snap.topics.items()):
        if not rx.fullmatch(name):
            continue
        tid = uuid_bytes(facts.topic_id)
        plan = TopicPlan(facts)
        for p in range(facts.partitions):
            pc = cache.get(tid, p)
            tier_end = pc.latest_tiered_offset() + 1 if pc is not None and pc.latest_tiered_offset() >= 0 else 0
            epochs = [e for md in (pc.all_segments() if pc else []) for e in md.segment_leader_epochs]
            rec = recorded.get((name, p))
            hw = rec.high_watermark if rec else 0
            gmax, gepoch = groups.get((name, p), (-1, -1))
            start = max(tier_end, hw, gmax)
            floor = max([*epochs, rec.leader_epoch if rec else 0, gepoch, 0])
            plan.partitions.append(PartitionPlan(name, p, tier_end, hw, gmax, start, floor))
        plans.append(plan)
    return plans


def check_target(plan: TopicPlan, existing: dict[int, TargetPartition] | None, ours: bool) -> str | None:
    """Why `plan`'s topic cannot be restored into what the new cluster holds, or None. `existing`: its partitions
    there (None: no such topic); `ours`: this restore created it (a rerun resumes it)."""
    if existing is None:
        return None
    name = plan.facts.name
    if len(existing) != plan.facts.partitions:
        return (f"topic {name} exists in the new cluster with {len(existing)} partitions, the tier's has "
                f"{plan.facts.partitions}: delete it there, or leave it out (--topics)")
    for pp in plan.partitions:
        t = existing[pp.partition]
        if t.high_watermark > pp.start:
            return (f"topic {name} partition {pp.partition} in the new cluster ends at {t.high_watermark}, past "
                    f"where the restored history begins ({pp.start}): it holds records, refusing to restore over it")
        if t.high_watermark > t.log_start and not ours:
            return (f"topic {name} partition {pp.partition} in the new cluster holds records "
                    f"({t.log_start}..{t.high_watermark - 1}): refusing to restore over them")
    return None
