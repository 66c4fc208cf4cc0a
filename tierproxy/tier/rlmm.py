"""RemoteLogMetadataManager (KIP-405): the strongly consistent record of which remote segments exist.

Writes are validated against the state machine, published, and return only once this instance's cache has
applied them (read-your-writes). Every segment event is stored as a full RemoteLogSegmentMetadataRecord carrying
its state, keyed `topicId:partition:endOffset:brokerLeaderEpoch` once its copy finished (before: by its segment id,
`serde.segment_id_key`): in a compacted topic the latest record of a key must stand on its own. After
DELETE_SEGMENT_FINISHED every key of that segment (same end offset, writer epochs up to the current one) gets a
tombstone, unless a live segment still uses it; after DELETE_PARTITION_FINISHED every segment key of the partition
does, and the partition marker stays. A replacement (`tier.replacement`) stays under its id key for life: its end
offset is the end of a segment it replaces, whose KIP key its records would overwrite.

Backends: `TopicRLMM` (a compacted topic on the upstream cluster, the default) and `FileRLMM` (one local file,
for single-node development and unit tests).
"""

from __future__ import annotations

import abc
import logging
import threading
import time
from dataclasses import replace

from tierproxy.tier.cache import MetadataCache, PartitionCache
from tierproxy.tier.model import (
    PartitionDeleteState,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemoteLogStartOffset,
    RemotePartitionDeleteMetadata,
    SegmentState,
    TierPass,
    TopicIdPartition,
    TopicMount,
    TransactionOutcome,
    check_partition_transition,
    check_segment_transition,
)
from tierproxy.tier.replacement import generation
from tierproxy.tier.serde import decode_value, encode_value, record_key, segment_id_key

log = logging.getLogger("tierproxy.rlmm")
NO_SOURCE = -1  # `apply_record` from a caller that lets a failing record raise
CHECKPOINT = -2  # from the local checkpoint (a failing entry is logged, not counted)


def now_ms() -> int:
    return int(time.time() * 1000)


class MetadataWriteRefused(RuntimeError):
    """The metadata topic refused a write outright (tierproxy's principal may not write it): nothing of the write
    was appended. Any other failure of a write (a timeout, a lost connection) may have been applied."""


class WriterFenced(RuntimeError):
    """Another tier job writes this metadata now: this one must stop (a second job started on a topic fences the
    first, Kafka's transactional producer epoch; on a file the first holds a lock and a second refuses)."""


class RemoteLogMetadataManager(abc.ABC):
    """Validated lifecycle writes and cache queries; subclasses provide publish/consume."""

    def __init__(self) -> None:
        self.cache = MetadataCache()
        self._keys: dict[tuple[bytes, int], set[bytes]] | None = None  # `keys`, once asked
        self.values: dict[bytes, bytes] = {}  # every live record, latest write last: what compaction keeps
        self._records_skipped = 0
        # segment records read from a source (`apply_record`'s) are kept as they came and applied when their
        # partition is first read (`tier.cache`): the proxy's view, whose start reads a million of them
        self.deferring = False
        self.consumer_restarts = 0  # the metadata consumer failed and was restarted (with backoff)
        self.failure: BaseException | None = None  # why the view is not moving right now (None: it is)
        self._changed: dict[bytes, bytes | None] | None = None  # live keys written since `take_changed` (if asked)
        self._changed_lock = threading.Lock()  # applied on the view's loop, taken from the tier job's thread

    @property
    def cache(self) -> MetadataCache:
        """Every partition's segments and deletion state, as applied."""
        return self._cache

    @cache.setter
    def cache(self, cache: MetadataCache) -> None:
        cache.skipped = self._deferred_failed
        self._cache = cache

    @property
    def records_skipped(self) -> int:
        """Malformed or inapplicable records, logged and skipped (deferred records applied first)."""
        self._cache.index_all()
        return self._records_skipped

    @property
    def keys(self) -> dict[tuple[bytes, int], set[bytes]]:
        """The live (not tombstoned) record keys per partition: made from `values` when first asked (a writer's
        retirements, a purge), kept up to date from then. A proxy's view of a million segments never asks."""
        if self._keys is None:
            keys: dict[tuple[bytes, int], set[bytes]] = {}
            for key in self.values:
                if (pk := _partition_of_key(key)) is not None:
                    keys.setdefault(pk, set()).add(key)
            self._keys = keys
        return self._keys

    @keys.setter
    def keys(self, keys: dict[tuple[bytes, int], set[bytes]]) -> None:
        self._keys = keys

    # --- backend -----------------------------------------------------------------------------------------------
    @abc.abstractmethod
    async def start(self) -> None: ...

    @abc.abstractmethod
    async def close(self) -> None: ...

    @abc.abstractmethod
    async def publish(self, records: list[tuple[bytes, bytes | None]]) -> None:
        """Store records (value None = tombstone) and return once the cache has applied them."""

    @abc.abstractmethod
    async def catch_up(self) -> None:
        """Apply everything published so far (by any writer)."""

    def lag_records(self) -> int:
        """Metadata records written (by any writer) that this view has not applied yet, as last seen."""
        return 0

    def apply_record(self, key: bytes | None, value: bytes | None, source: int = NO_SOURCE, offset: int = -1
                     ) -> None:
        """Apply one stored record (value None = tombstone, which only retires its key). `source` (a metadata
        partition, or CHECKPOINT) and `offset`: where it was read, by a caller that logs and skips a record that
        fails: with `deferring`, a segment record from a source is applied when its partition is first read, and
        one that fails then is logged and skipped the same way (`_deferred_failed`)."""
        # (a key written again is applied at once: were it to fail later, its previous record's place among the
        # live records, which a checkpoint replays in order, would be lost; a compacted topic repeats few keys)
        if self.deferring and source != NO_SOURCE and key and type(value) is bytes and key not in self.values \
                and (key[0] != 116 or not key.startswith(b"tierproxy:tierPass:")) \
                and self._cache.defer(value, key, source, offset):  # (116: "t")
            self.values[key] = value
            if self._changed is not None:
                self._note_changed(key, value)
            if self._keys is not None and (pk := _partition_of_key(key)) is not None:
                self._keys.setdefault(pk, set()).add(key)
            return
        if self.deferring and key and (live := self.values.get(key)) is not None:
            self._cache.retire(live, value if type(value) is bytes else None if value is None else bytes(value))
        pk = _partition_of_key(key) if key and self._keys is not None else None
        if value is None:
            if pk is not None and self._keys is not None:
                self._keys.get(pk, set()).discard(key)
            if key and self.values.pop(key, None) is not None and self._changed is not None:
                self._note_changed(key, None)
            return
        stored = bytes(value)  # one object: the live record below and, for a segment, the cache's form of it
        event = decode_value(stored)  # (a segment record: its partition's deferred ones are applied first)
        if isinstance(event, RemoteLogSegmentMetadata):
            self.cache.apply_record(event, stored)
        else:
            self.cache.apply(event)
        if key and not key.startswith(b"tierproxy:tierPass:"):  # a pass request is this cluster's, not history
            self.values.pop(key, None)
            self.values[key] = stored
            if self._changed is not None:
                self._note_changed(key, stored)
        if pk is not None and key is not None and self._keys is not None:
            self._keys.setdefault(pk, set()).add(key)

    def _deferred_failed(self, key: bytes, value: bytes, source: int, offset: int, exc: Exception) -> None:
        """A deferred record failed when applied: skipped as it would have been at once (logged, counted when read
        from the topic, and its key not live: a key is deferred only when it had no live record)."""
        if source == CHECKPOINT:
            log.error("checkpoint: %s (entry skipped)", exc)
        else:
            self._records_skipped += 1
            log.error("metadata partition %d offset %d: %s (record skipped)", source, offset, exc)
        if self.values.get(key) is not value:
            return  # written again since, or retired: as if it had been skipped at once
        del self.values[key]
        if self._changed is not None:
            self._note_changed(key, None)
        pk = _partition_of_key(key) if self._keys is not None else None
        if pk is not None and self._keys is not None:
            self._keys.get(pk, set()).discard(key)

    def _note_changed(self, key: bytes, value: bytes | None) -> None:
        with self._changed_lock:
            if self._changed is not None:
                self._changed.pop(key, None)  # latest write last, as `values` keeps them
                self._changed[key] = value

    def take_changed(self) -> dict[bytes, bytes | None] | None:
        """The live records written since the last call (None: removed), latest write last: what an incremental
        snapshot writes (`tier.snapshot.SnapshotWriter`). None on the first call, from which the view tracks them."""
        with self._changed_lock:
            taken, self._changed = self._changed, {}
        return taken

    # --- writes ------------------------------------------------------------------------------------------------
    async def add_segment(self, md: RemoteLogSegmentMetadata) -> None:
        """COPY_SEGMENT_STARTED for a new segment id."""
        pc = self.cache.get(md.tp.topic_id, md.tp.partition)
        current = pc.segments.get(md.segment_id.id) if pc else None
        check_segment_transition(current.state if current else None, md.state, md.segment_id)
        await self.publish([(segment_id_key(md.segment_id), encode_value(md))])

    async def add_segments(self, mds: list[RemoteLogSegmentMetadata]) -> None:
        """COPY_SEGMENT_STARTED for many new segments in one publish (one wait for the cache)."""
        for md in mds:
            pc = self.cache.get(md.tp.topic_id, md.tp.partition)
            current = pc.segments.get(md.segment_id.id) if pc else None
            check_segment_transition(current.state if current else None, md.state, md.segment_id)
        await self.publish([(segment_id_key(md.segment_id), encode_value(md)) for md in mds])

    async def update_segment(self, up: RemoteLogSegmentMetadataUpdate) -> RemoteLogSegmentMetadata:
        pc = self.cache.get(up.segment_id.tp.topic_id, up.segment_id.tp.partition)
        current = pc.segments.get(up.segment_id.id) if pc else None
        check_segment_transition(current.state if current else None, up.state, up.segment_id)
        assert current is not None and pc is not None
        md = current.with_update(up)
        await self.publish(self._lifecycle_records(pc, md))
        return md

    def _lifecycle_records(self, pc: PartitionCache, md: RemoteLogSegmentMetadata) -> list[tuple[bytes, bytes | None]]:
        """A segment's next state and the keys it retires. Until its copy finishes a segment lives under its id
        key (serde: a planned range's end is not its real end); a copy that finishes moves to its KIP key."""
        id_key = segment_id_key(md.segment_id)
        unfinished = id_key in self.keys.get((md.tp.topic_id, md.tp.partition), set())
        if generation(md) or (unfinished and md.state != SegmentState.COPY_SEGMENT_FINISHED):
            records: list[tuple[bytes, bytes | None]] = [(id_key, encode_value(md))]
            return [*records, (id_key, None)] if md.state == SegmentState.DELETE_SEGMENT_FINISHED else records
        records = [(record_key(md), encode_value(md))]
        if unfinished:
            records.append((id_key, None))
        if md.state == SegmentState.DELETE_SEGMENT_FINISHED:
            records += [(k, None) for k in self._dead_keys(pc, md)]
        return records

    async def finish_copy(self, facts: RemoteLogSegmentMetadata,
                          outcomes: list[TransactionOutcome] | None = None) -> RemoteLogSegmentMetadata:
        """COPY_SEGMENT_FINISHED carrying the copied segment's facts (its exact offsets, epochs, size), which may
        differ from what STARTED planned; the planned key is retired if nothing else uses it. `outcomes` (of the
        transactions open at the segment's end, `tier.transactions`) go in the same publish, before it: a served
        segment never lacks them."""
        md, records = self._finished(facts)
        await self.publish([*((record_key(o), encode_value(o)) for o in outcomes or ()), *records])
        return md

    async def finish_copies(self, facts: list[RemoteLogSegmentMetadata]) -> list[RemoteLogSegmentMetadata]:
        """COPY_SEGMENT_FINISHED for several segments in one publish: a reader applies all or none of them (the
        new segments replacing a group together, `tier.replacement`)."""
        made = [self._finished(f) for f in facts]
        await self.publish([r for _, records in made for r in records])
        return [md for md, _ in made]

    def _finished(self, facts: RemoteLogSegmentMetadata
                  ) -> tuple[RemoteLogSegmentMetadata, list[tuple[bytes, bytes | None]]]:
        pc = self.cache.get(facts.tp.topic_id, facts.tp.partition)
        current = pc.segments.get(facts.segment_id.id) if pc else None
        check_segment_transition(current.state if current else None, SegmentState.COPY_SEGMENT_FINISHED,
                                 facts.segment_id)
        assert current is not None and pc is not None
        md = replace(facts, state=SegmentState.COPY_SEGMENT_FINISHED, event_timestamp_ms=now_ms(),
                     broker_leader_epoch=current.broker_leader_epoch)
        records = self._lifecycle_records(pc, md)
        planned = record_key(current)  # a segment started under its planned end's key (older tierproxy)
        live = {live_key(s) for s in pc.segments.values() if s.segment_id != md.segment_id}
        if planned not in (record_key(md), *live) and planned in self.keys.get((md.tp.topic_id, md.tp.partition), ()):
            records.append((planned, None))
        return md, records

    def _dead_keys(self, pc: PartitionCache, md: RemoteLogSegmentMetadata) -> list[bytes]:
        """Keys of this segment's end offset written at epochs up to the current one, unless still live."""
        live = {live_key(s) for s in pc.segments.values() if s.segment_id != md.segment_id}
        prefix = record_key(md).rsplit(b":", 1)[0] + b":"
        out = []
        for k in self.keys.get((md.tp.topic_id, md.tp.partition), set()) | {record_key(md)}:
            if k.startswith(prefix) and int(k.rsplit(b":", 1)[1]) <= md.broker_leader_epoch and k not in live:
                out.append(k)
        return sorted(out)

    async def put_partition_delete(self, pdm: RemotePartitionDeleteMetadata) -> None:
        key = (pdm.tp.topic_id, pdm.tp.partition)
        current = self.cache.deletions.get(key)
        check_partition_transition(current.state if current else None, pdm.state, pdm.tp)
        records: list[tuple[bytes, bytes | None]] = [(record_key(pdm), encode_value(pdm))]
        if pdm.state == PartitionDeleteState.DELETE_PARTITION_FINISHED:
            pc = self.cache.get(*key)
            remaining = list(pc.segments.values()) if pc else []
            if remaining:
                raise ValueError(f"{pdm.tp}: {len(remaining)} segments are not deleted yet")
            marker = record_key(pdm)
            records += [(k, None) for k in sorted(self.keys.get(key, set())) if k != marker]
        await self.publish(records)

    async def put_tier_pass(self, event: TierPass) -> None:
        """A tiering pass asked for (the admin API's trigger), or the pass that served it (the tier job)."""
        await self.publish([(record_key(event), encode_value(event))])

    async def put_log_start(self, tp: TopicIdPartition, log_start_offset: int, broker_id: int = -1) -> bool:
        """Record a purge: the partition's log start moved to `log_start_offset` (False: it is not above the
        current one, nothing written)."""
        pc = self.cache.get(tp.topic_id, tp.partition)
        if pc is not None and log_start_offset <= pc.log_start_offset:
            return False
        event = RemoteLogStartOffset(tp, log_start_offset, now_ms(), broker_id)
        key = record_key(event)
        prefix = key.rsplit(b":", 1)[0]  # topicId:partition:logStart
        known = self.keys.get((tp.topic_id, tp.partition), set())
        lower = sorted(k for k in known if k == prefix or (k.startswith(prefix + b":") and
                                                           _offset_of(k) < log_start_offset))
        await self.publish([(key, encode_value(event)), *((k, None) for k in lower)])
        return True

    async def put_outcomes(self, outcomes: list[TransactionOutcome]) -> None:
        """Transaction outcomes (`tier.transactions`); a decided one already recorded is final, never replaced."""
        fresh = [o for o in outcomes if (pc := self.cache.get(o.tp.topic_id, o.tp.partition)) is None
                 or (old := pc.outcomes.get((o.producer_id, o.first_offset))) is None or not old.decided]
        if fresh:
            await self.publish([(record_key(o), encode_value(o)) for o in fresh])

    async def put_mounts(self, mounts: list[TopicMount]) -> None:
        """A restore's hand-over of topic ids from a lost cluster (`TopicMount`)."""
        await self.publish([(record_key(m), encode_value(m)) for m in mounts])

    async def put_records(self, records: list[tuple[bytes, bytes]]) -> None:
        """Records as another metadata topic held them (a tier snapshot's, replayed by a restore): stored unchanged,
        each standing on its own as in a compacted topic; malformed ones raise before anything is written."""
        for _, value in records:
            decode_value(value)
        await self.publish(list(records))

    def unknown_records(self, records: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
        """Of another view's records (a tier snapshot's), those about topic ids this view knows nothing of, and
        keys of no partition it does not hold: replaying only these never takes back what this view has moved
        on from (a segment deleted since, a newer state)."""
        known = {tid for tid, _ in self.cache.partitions} | {tid for tid, _ in self.cache.deletions}
        out = []
        for key, value in records:
            pk = _partition_of_key(key)
            if (pk is None and key not in self.values) or (pk is not None and pk[0] not in known):
                out.append((key, value))
        return out

    def live_records(self) -> list[tuple[bytes, bytes]]:
        """Every live record (latest write per key, in write order): replayed, they give this view."""
        return list(self.values.items())

    # --- queries -----------------------------------------------------------------------------------------------
    def partition(self, tp: TopicIdPartition) -> PartitionCache | None:
        return self.cache.get(tp.topic_id, tp.partition)

    def segment_for(self, tp: TopicIdPartition, offset: int, leader_epoch: int) -> RemoteLogSegmentMetadata | None:
        pc = self.partition(tp)
        return pc.segment_for(offset, leader_epoch) if pc else None

    def segments(self, tp: TopicIdPartition) -> list[RemoteLogSegmentMetadata]:
        pc = self.partition(tp)
        return pc.all_segments() if pc else []


class ReplayedMetadata(RemoteLogMetadataManager):
    """A read-only view built from stored records (a tier snapshot's): what they say, with nothing published."""

    @classmethod
    def of(cls, records: list[tuple[bytes, bytes]]) -> ReplayedMetadata:
        view = cls()
        for key, value in records:
            view.apply_record(key, value)
        return view

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def publish(self, records: list[tuple[bytes, bytes | None]]) -> None:
        raise RuntimeError("a replayed metadata view is read-only")

    async def catch_up(self) -> None:
        return None


def live_key(md: RemoteLogSegmentMetadata) -> bytes:
    """The KIP key a segment's records stand under once finished: its id key for a replacement."""
    return segment_id_key(md.segment_id) if generation(md) else record_key(md)


def _offset_of(log_start_key: bytes) -> int:
    try:
        return int(log_start_key.rsplit(b":", 1)[1])
    except ValueError:
        return -1


_KEY_PARTITIONS: dict[bytes, tuple[bytes, int] | None] = {}  # "topicId:partition" as keys start → its key
_KEY_PARTITIONS_MAX = 200_000


def _partition_of_key(key: bytes) -> tuple[bytes, int] | None:
    from tierproxy.tier.model import uuid_bytes

    head = key.split(b":", 2)
    prefix = b":".join(head[:2])
    found = _KEY_PARTITIONS.get(prefix, False)
    if found is not False:
        return found  # type: ignore[return-value]
    try:
        found = uuid_bytes(head[0].decode()), int(head[1])
    except (ValueError, IndexError):
        found = None
    if len(_KEY_PARTITIONS) >= _KEY_PARTITIONS_MAX:
        _KEY_PARTITIONS.clear()
    _KEY_PARTITIONS[prefix] = found
    return found


def new_segment(tp: TopicIdPartition, segment_id: bytes, start: int, end: int, max_ts: int,
                epochs: dict[int, int], size: int, *, broker_id: int = -1, broker_leader_epoch: int = 0,
                txn_index_empty: bool = False) -> RemoteLogSegmentMetadata:
    """COPY_SEGMENT_STARTED metadata for a segment about to be copied."""
    from tierproxy.tier.model import RemoteLogSegmentId

    return RemoteLogSegmentMetadata(RemoteLogSegmentId(tp, segment_id), start, end, max_ts, broker_id, now_ms(),
                                    dict(epochs), size, SegmentState.COPY_SEGMENT_STARTED, txn_index_empty, None,
                                    broker_leader_epoch)


def transition(md: RemoteLogSegmentMetadata, state: SegmentState, *, broker_id: int | None = None,
               broker_leader_epoch: int | None = None) -> RemoteLogSegmentMetadataUpdate:
    return RemoteLogSegmentMetadataUpdate(
        md.segment_id, now_ms(), state, md.broker_id if broker_id is None else broker_id, None,
        md.broker_leader_epoch if broker_leader_epoch is None else broker_leader_epoch, md.end_offset)
