"""What a restore does to each partition, decided before anything changes (pure: facts in, plan or refusal out).

A restored partition begins where the lost one ended: at S = max(the tier's end N, the high watermark recorded at
the last pass, the highest offset a group committed). Offsets [N, S) were produced after the last pass and are
lost: reported, never reused (a group that had read past N must not see those offsets name other records). The
new cluster's leader epoch is raised above every epoch the history used (the tier's segments, the recorded leader
epoch, the groups' committed epochs), so the lineage stays monotonic across the two clusters.

The facts come from the lost cluster's kept snapshots, not the newest alone (`choose_facts`): the last passes before
a loss are when brokers fail, and a pass records what it could not read. Each partition's and group's facts come
from the newest snapshot that holds them whole, a high watermark is never below one an older snapshot recorded, and
what none holds whole is missing: the restore refuses, naming it, unless told to go on without it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from tierproxy.tier.cache import MetadataCache
from tierproxy.tier.model import uuid_bytes
from tierproxy.tier.rlmm import ReplayedMetadata
from tierproxy.tier.snapshot import (
    GROUP,
    LISTING,
    PARTITION,
    GroupOffset,
    PartitionFacts,
    TierSnapshot,
    TopicFacts,
    Unread,
)


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


@dataclass
class ChosenFacts:
    snapshot: TierSnapshot  # the newest snapshot with each partition's and group's facts chosen; `unread`: missing
    older: list[str] = field(default_factory=list)  # facts taken from an older snapshot: which, and why

    def missing_for(self, topics: set[str]) -> list[Unread]:
        """What no kept snapshot holds whole, of a restore of `topics` (any group's: it may read them)."""
        return [u for u in self.snapshot.unread if u.kind != PARTITION or u.name in topics]


def choose_facts(snaps: list[TierSnapshot]) -> ChosenFacts:
    """One cluster's snapshots (newest first) → the facts a restore plans from. Topics and metadata records are
    the newest's (the tier's state at the last pass). Per partition: the newest whole facts, with the highest
    high watermark and leader epoch any snapshot recorded (a leaderless partition read as 0 must never lower S).
    Per group: its offsets in the newest snapshot that holds it whole (a group a whole listing lacks has none
    left). Missing: what no snapshot holds whole."""
    newest = snaps[0]
    older: list[str] = []
    missing: list[Unread] = []
    partitions: list[PartitionFacts] = []
    # each snapshot's partitions by (topic, partition) (its first entry for one, as a scan finds it) and its unread
    # ones, once: a look-up per partition, not a scan of every snapshot's list (thousands of partitions)
    index = [({(f.topic, f.partition): f for f in reversed(s.partitions)},
              {(u.name, u.partition) for u in s.unread if u.kind == PARTITION}) for s in snaps]
    for name, facts in sorted(newest.topics.items()):
        for p in range(facts.partitions):
            held = [found[(name, p)] for found, unread in index if (name, p) in found and (name, p) not in unread]
            if not held:
                missing.append(_why(newest, PARTITION, name, p, "not recorded by any kept pass"))
                continue
            f = held[0]  # the newest snapshot's that read it whole
            source = next(s for s, (found, _) in zip(snaps, index, strict=True) if found.get((name, p)) is f)
            partitions.append(replace(f, high_watermark=max(x.high_watermark for x in held),
                                      leader_epoch=max(x.leader_epoch for x in held)))
            if source is not newest:
                older.append(f"{name}-{p} from the pass at {source.taken_ms} "
                             f"(the last: {_why(newest, PARTITION, name, p, 'not recorded').why})")
    groups: dict[str, list[GroupOffset]] = {}
    for g in sorted({g for s in snaps for g in s.groups} | {u.name for u in newest.unread if u.kind == GROUP}):
        chosen = next((s for s in snaps if s.group_whole(g) and (g in s.groups or s.listing_whole())), None)
        if chosen is None:
            missing.append(_why(newest, GROUP, g, -1, "not listed by any kept pass"))
            continue
        if g in chosen.groups:
            groups[g] = chosen.groups[g]
        if chosen is not newest:
            older.append(f"group {g} from the pass at {chosen.taken_ms}")
    if not newest.listing_whole():
        whole = next((s for s in snaps if s.listing_whole()), None)
        if whole is None:
            missing += [u for u in newest.unread if u.kind == LISTING]
        else:
            older.append(f"the group listing from the pass at {whole.taken_ms} (the last: "
                         f"{'; '.join(u.describe() for u in newest.unread if u.kind == LISTING)})")
    unreadable = "; ".join(u.describe() for u in missing if u.kind != PARTITION) or None
    return ChosenFacts(replace(newest, partitions=partitions, groups=groups, unread=missing,
                               groups_unreadable=unreadable), older)


def _why(snap: TierSnapshot, kind: str, name: str, partition: int, default: str) -> Unread:
    found = next((u for u in snap.unread if (u.kind, u.name, u.partition) == (kind, name, partition)), None)
    return found or Unread(kind, name, partition, default)


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
            purged = pc.log_start_offset if pc is not None else 0  # a purge there proves the log reached it
            start = max(tier_end, hw, gmax, purged)
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
