"""The tier's description of itself: what makes its segments readable without the cluster they came from.

Each `tier` pass writes one snapshot object under the tier's prefix, `snapshots/<taken ms>-<run id>.json`:
- the lineage: the cluster the pass ran against, and the metadata topic (name and id) the records come from;
- every live record of the remote log metadata (segments in any state, recorded purges, partition deletions,
  mounts), exactly as the compacted topic holds them: replayed in order into a metadata topic, they give the same
  view (`RemoteLogMetadataManager.live_records`);
- per tiered topic its id, partition count and the configs a restore recreates (`RESTORED_CONFIGS`);
- per partition its high watermark, log start and leader epoch at the pass;
- the committed offsets (with leader epoch and metadata) of every group with commits on a tiered topic;
- what the pass could not read, item by item (`Unread`): a partition whose offsets its leader did not give, a
  group whose coordinator or OffsetFetch failed, a broker whose ListGroups failed (its groups may all be missing).
  An item that is unread is not whole: a restore takes it from an older snapshot that holds it whole
  (`restore.plan.choose_facts`), or refuses, naming it.
A snapshot is written whole (a file store writes a temporary file and renames it; an S3 PUT is atomic) and the
newest one that parses wins (`newest`). The last `KEPT` are kept; older ones are deleted by the pass that writes a
newer one. A restore copies what it planned from into its own state, so a later stage never needs them.
Format 2 added `unread`; format 1 is read as well (its unread partitions are those it lacks, its
`groups_unreadable` an unread group listing). Format 3 (what a `tier` pass writes, `SnapshotWriter`) is a root
without the records: it names the chain of record objects that replays to them (`tier.snapshot_chain`), so a pass
writes what changed, not the whole tier's metadata. A root whose chain does not load whole is skipped as a snapshot
cut short is. `encode` still gives the whole form (format 2: a restore's pinned copy of its facts).

What a lost cluster costs is what was produced after the last pass: the recovery point is the pass interval.
"""

from __future__ import annotations

import base64
import json
import logging
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from tierproxy.tier.snapshot_chain import RECORDS, ChainState, encode_records
from tierproxy.tier.snapshot_chain import load as chain_records
from tierproxy.tier.storage import ObjectMissing, ObjectStore, StorageError

log = logging.getLogger("tierproxy.tier")

PREFIX = "snapshots/"
FORMAT = 2  # the whole form (`encode`)
ROOT_FORMAT = 3  # a root naming its chain of record objects (`encode_root`)
READABLE = (1, 2, 3)
KEPT = 5
# the topic configs a restore recreates (any other config takes the new cluster's default)
RESTORED_CONFIGS = ("cleanup.policy", "retention.ms", "retention.bytes", "compression.type", "max.message.bytes",
                    "message.timestamp.type", "message.timestamp.before.max.ms", "message.timestamp.after.max.ms",
                    "min.insync.replicas", "segment.bytes", "segment.ms", "min.compaction.lag.ms",
                    "max.compaction.lag.ms", "delete.retention.ms", "min.cleanable.dirty.ratio")


@dataclass(frozen=True)
class TopicFacts:
    """A tiered topic as its cluster described it at the pass."""

    name: str
    topic_id: str  # the id the tier keeps its history under (Kafka's base64 form)
    cluster_topic_id: str  # the cluster's own id (differs for a topic a restore continued)
    partitions: int
    replication_factor: int
    configs: dict[str, str]


@dataclass(frozen=True)
class PartitionFacts:
    topic: str
    partition: int
    high_watermark: int
    log_start: int
    leader_epoch: int


@dataclass(frozen=True)
class GroupOffset:
    topic: str
    partition: int
    offset: int
    leader_epoch: int  # -1: committed without one
    metadata: str | None


@dataclass(frozen=True)
class Unread:
    """One item a pass could not read. `kind`: PARTITION (`name` the topic), GROUP (`name` the group) or LISTING
    (`name` the broker whose ListGroups failed, "" for the principal's listing: the groups it coordinates, or may
    not describe, are not named)."""

    kind: str
    name: str
    partition: int  # -1 unless a partition
    why: str

    def describe(self) -> str:
        what = {PARTITION: f"partition {self.name}-{self.partition}", GROUP: f"group {self.name}",
                LISTING: f"the group listing at {self.name or 'the cluster'}"}.get(self.kind, self.kind)
        return f"{what} ({self.why})"


PARTITION, GROUP, LISTING = "partition", "group", "listing"


@dataclass
class TierSnapshot:
    cluster_id: str
    taken_ms: int
    run_id: str
    metadata_topic: str | None  # the metadata topic's name and id (None: a file metadata store)
    metadata_topic_id: str | None
    topics: dict[str, TopicFacts] = field(default_factory=dict)
    partitions: list[PartitionFacts] = field(default_factory=list)
    groups: dict[str, list[GroupOffset]] = field(default_factory=dict)
    groups_unreadable: str | None = None  # why some group offsets are missing (the group items of `unread`)
    records: list[tuple[bytes, bytes]] = field(default_factory=list)  # live metadata records, in order
    unread: list[Unread] = field(default_factory=list)  # what the pass could not read, item by item
    chain: list[str] = field(default_factory=list)  # a root's record objects (format 3; `records` once loaded)

    def partition_whole(self, topic: str, partition: int) -> bool:
        """Whether the pass read this partition's offsets (a partition it lacks is unread, whatever it says)."""
        return any((p.topic, p.partition) == (topic, partition) for p in self.partitions) and not any(
            u.kind == PARTITION and (u.name, u.partition) == (topic, partition) for u in self.unread)

    def listing_whole(self) -> bool:
        """Whether every broker named its groups: otherwise a group missing here may exist."""
        return not any(u.kind == LISTING for u in self.unread)

    def group_whole(self, group: str) -> bool:
        return not any(u.kind == GROUP and u.name == group for u in self.unread)

    @property
    def name(self) -> str:
        return f"{PREFIX}{self.taken_ms:020d}-{self.run_id}.json"

    def encode(self) -> bytes:
        """The whole snapshot, its records in it."""
        d: dict[str, Any] = asdict(self)
        d["format"] = FORMAT
        d.pop("chain")
        d["records"] = [[base64.b64encode(k).decode(), base64.b64encode(v).decode()] for k, v in self.records]
        return json.dumps(d, separators=(",", ":")).encode()

    def encode_root(self) -> bytes:
        """The root: everything but the records, which its chain holds."""
        d: dict[str, Any] = asdict(self)
        d["format"] = ROOT_FORMAT
        d.pop("records")
        return json.dumps(d, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, raw: bytes) -> TierSnapshot:
        """Raises ValueError for anything but a whole snapshot of a known format."""
        try:
            d = json.loads(raw)
            if d.get("format") not in READABLE:
                raise ValueError(f"unknown snapshot format {d.get('format')!r}")
            if d["format"] >= 3 and not d["chain"]:
                raise ValueError("a root naming no record objects")
            unread = [Unread(**u) for u in d.get("unread", [])] if d["format"] >= 2 else \
                [Unread(LISTING, "", -1, d["groups_unreadable"])] if d["groups_unreadable"] else []
            return cls(
                d["cluster_id"], int(d["taken_ms"]), d["run_id"], d["metadata_topic"], d["metadata_topic_id"],
                {n: TopicFacts(**t) for n, t in d["topics"].items()},
                [PartitionFacts(**p) for p in d["partitions"]],
                {g: [GroupOffset(**o) for o in offs] for g, offs in d["groups"].items()},
                d["groups_unreadable"],
                [] if d["format"] >= 3 else [(base64.b64decode(k), base64.b64decode(v)) for k, v in d["records"]],
                unread, [str(n) for n in d["chain"]] if d["format"] >= 3 else [])
        except (KeyError, TypeError, AttributeError, json.JSONDecodeError) as exc:
            raise ValueError(f"not a whole tier snapshot: {exc!r}") from None


def _key(prefix: str, name: str) -> str:
    return f"{prefix}/{name}" if prefix else name


async def write(store: ObjectStore, prefix: str, snap: TierSnapshot) -> str:
    """Write `snap` whole, then delete all but the newest `KEPT`; returns its key."""
    key = _key(prefix, snap.name)
    await store.put(key, snap.encode())
    names = sorted(await store.list(_key(prefix, PREFIX)))
    old = [k for k in names if k.endswith(".json")][:-KEPT]
    if old:
        await store.delete_many(old)
    return key


class SnapshotWriter:
    """Writes a tier job's snapshots as roots and chains (format 3), the chain's state kept between passes: a pass
    writes one record object of what changed (`tier.snapshot_chain`), then the root naming the chain. The first
    pass of a process continues the newest root of its cluster whose chain loads (read once), or writes a base."""

    def __init__(self, store: ObjectStore, prefix: str, tracked: bool = False) -> None:
        """`tracked`: each `write` after the first is told what changed (`RemoteLogMetadataManager.take_changed`)."""
        self.store, self.prefix, self.tracked = store, prefix, tracked
        self._pending: dict[bytes, bytes | None] = {}  # changes told and not yet in a written root
        self._told = False  # the view has told what changed since the last root (`note`): `_pending` is complete
        self.state: ChainState | None = None
        self._chains: dict[str, list[str]] = {}  # root key -> its chain, as read or written (for the clean-up)
        self._names: set[str] = set()  # every snapshot object: as listed once, then as written and deleted
        self.last_bytes = 0  # what the last `write` put: its record object and its root

    def note(self, changed: dict[bytes, bytes | None] | None) -> None:
        """Take what the metadata view says changed (`RemoteLogMetadataManager.take_changed`) as soon as it is
        taken, before anything that may fail: kept until a root holding it is written. None: the view's first
        answer (it tracks from then on), nothing to take."""
        if changed is None:
            return
        self._told = True
        for k, v in changed.items():
            self._pending.pop(k, None)
            self._pending[k] = v

    async def write(self, snap: TierSnapshot, changed: dict[bytes, bytes | None] | None = None) -> str:
        """Write `snap` (its `records` the live metadata records; `changed`, or what `note` took, those written
        since the last call) as a root and what its chain lacks; then delete all roots but the newest `KEPT`, and
        every record object none of them names (never this root nor what it names). Returns the root's key."""
        self.note(changed)
        if self.state is None:
            self.state = await self._resume(snap.cluster_id)
        step = self.state.next_step(snap.records, f"{RECORDS}{snap.taken_ms:020d}-{snap.run_id}.rec",
                                    self._pending if self._told else None)
        body = encode_records(step.records) if step.name in step.chain else b""
        if body:
            await self.store.put(_key(self.prefix, step.name), body)
            self._names.add(_key(self.prefix, step.name))
        root = replace(snap, records=[], chain=step.chain).encode_root()
        key = _key(self.prefix, snap.name)
        await self.store.put(key, root)  # the root last: a reader never meets a chain not yet written
        self.last_bytes = len(body) + len(root)
        self.state.advance(snap.records, step, self.tracked)
        self._pending, self._told = {}, False  # the next pass is told again, or writes a base
        self._chains[key] = step.chain
        self._names.add(key)
        await self._clean(key, snap.taken_ms)
        return key

    async def _resume(self, cluster_id: str) -> ChainState:
        self._names = set(await self.store.list(_key(self.prefix, PREFIX)))  # the only listing: no LIST a pass
        keys = sorted((k for k in self._names if k.endswith(".json")), reverse=True)
        for key in keys:
            try:
                root = TierSnapshot.decode(await self.store.get(key))
                if root.cluster_id != cluster_id:
                    continue
                if not root.chain:
                    return ChainState()  # a whole snapshot of an earlier version: the chain starts with a base
                return await ChainState.of_root(self.store, self.prefix, root.chain)
            except (ValueError, ObjectMissing) as exc:
                log.warning("tier snapshot %s not continued: %s", key, exc)
        return ChainState()

    async def _clean(self, written: str, taken_ms: int) -> None:
        names = sorted(self._names)
        roots = sorted(k for k in names if k.endswith(".json"))
        # by name (time), the newest KEPT; never the root just written, even if its clock is behind another's
        old, kept = [k for k in roots[:-KEPT] if k != written], [*roots[-KEPT:], written]
        named: set[str] = set()
        for key in kept:
            if key not in self._chains:
                try:
                    self._chains[key] = TierSnapshot.decode(await self.store.get(key)).chain
                except (ValueError, ObjectMissing):
                    self._chains[key] = []  # not whole: names nothing a reader could load
            named |= {_key(self.prefix, n) for n in self._chains[key]}
        records_at = _key(self.prefix, RECORDS)
        # a record object no kept root names, written before this root (a later one may be a writer's in flight)
        unnamed = [k for k in names if k.startswith(records_at) and k not in named
                   and k[len(records_at):len(records_at) + 20] <= f"{taken_ms:020d}"]
        if old or unnamed:
            await self.store.delete_many(old + unnamed)
        for key in old:
            self._chains.pop(key, None)
        self._names -= {*old, *unnamed}


async def _read(store: ObjectStore, key: str, prefix: str, records: bool) -> TierSnapshot:
    """A snapshot, its records loaded from its chain when `records` (ValueError or ObjectMissing: not whole)."""
    snap = TierSnapshot.decode(await store.get(key))
    if records and snap.chain:
        snap.records = await chain_records(store, prefix, snap.chain)
    return snap


async def read(store: ObjectStore, prefix: str, name: str) -> TierSnapshot:
    """The snapshot at `name` (under `prefix`), records and all. ValueError or ObjectMissing: not whole."""
    return await _read(store, _key(prefix, name), prefix, records=True)


async def pin(store: ObjectStore, prefix: str, name: str, snap: TierSnapshot) -> None:
    """Keep `snap` at `name` for good (a restore's facts): its records as one record object beside it, then the
    root naming it (the tier's own chains are cleaned up as passes go on; this one is not theirs)."""
    records = f"{name.removesuffix('.json')}.rec"
    await store.put(_key(prefix, records), encode_records(snap.records))
    await store.put(_key(prefix, name), replace(snap, records=[], chain=[records]).encode_root())


async def of_cluster(store: ObjectStore, prefix: str, cluster_id: str | None = None) -> list[TierSnapshot]:
    """Every snapshot that parses, newest first, of `cluster_id` (None: of the newest one's cluster). Records are
    loaded for the newest only (what a restore replays; a root whose chain does not load is skipped); the others'
    facts are read, their `records` left empty when a chain holds them."""
    keys = sorted((k for k in await store.list(_key(prefix, PREFIX)) if k.endswith(".json")), reverse=True)
    out: list[TierSnapshot] = []
    for key in keys:
        try:
            snap = await _read(store, key, prefix, records=False)
            cluster_id = cluster_id if cluster_id is not None else snap.cluster_id
            if snap.cluster_id != cluster_id:
                continue
            if not out and snap.chain:
                snap.records = await chain_records(store, prefix, snap.chain)
        except (ValueError, ObjectMissing) as exc:
            log.warning("skipping tier snapshot %s: %s", key, exc)
            continue
        out.append(snap)
    return out


async def newest(store: ObjectStore, prefix: str) -> TierSnapshot | None:
    """The newest snapshot that parses whole, records and all (one cut short, or whose chain does not load, is
    skipped with a warning); None: none."""
    keys = sorted((k for k in await store.list(_key(prefix, PREFIX)) if k.endswith(".json")), reverse=True)
    for key in keys:
        try:
            return await _read(store, key, prefix, records=True)
        except (ValueError, ObjectMissing) as exc:
            log.warning("skipping tier snapshot %s: %s", key, exc)
        except StorageError:
            raise
    return None
