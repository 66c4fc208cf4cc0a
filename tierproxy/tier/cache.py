"""The RLMM cache: applies lifecycle events (validating the state machine) and answers segment queries.

Per partition and leader epoch, FINISHED segments are indexed by the start offset of that epoch within them.
When two finished segments claim the same (epoch, start offset) — a leadership change during upload — the one
of the higher generation (`tier.replacement`) wins, then the one written by the higher broker leader epoch, then
the later event; the loser is "unreferenced", kept for
cleanup but never served. A finished segment whose range finished ones of higher generations cover between them
(replacements, `tier.replacement`) is unreferenced too ("shadowed"), in whatever order their records come; it is
served again if a replacement is deleted before it.

A view may defer its segment records (`MetadataCache.defer`, the proxy's: a million of them at start): each is kept
as the bytes it came in, in its partition's arrival order, and the partition applies them — the same way, in the
same order — the first time anything asks its segments, epochs or unreferenced ids. The other events (purges,
outcomes, partition deletions, passes, mounts) are applied as they come: none depends on a partition's segments.
A partition where a segment's state rests on a record no longer live (`MetadataCache.retire`) applies its records
as they come.
"""

from __future__ import annotations

import asyncio
import bisect
import threading
from collections.abc import Callable, Iterator

from protocol.errors import ProtocolError
from tierproxy.tier.epoch_index import EpochIndex
from tierproxy.tier.model import (
    IllegalStateTransition,
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
from tierproxy.tier.replacement import covered, generation
from tierproxy.tier.rules import holes_between, served_segments, tier_start
from tierproxy.tier.segment_record import partition_named
from tierproxy.tier.segment_table import MATERIALIZED, SegmentTable
from tierproxy.tier.serde import decode_value, shared_tip
from tierproxy.tier.winners import Winners

PartitionKey = tuple[bytes, int]  # (topic id, partition): names can be reused after a delete, ids cannot
# a deferred record that failed when applied: (key, value, source, offset, why)
Skipped = Callable[[bytes, bytes, int, int, Exception], None]
DEFERRED = 4  # a deferred record's slots in `PartitionCache._pending`: key, value, source, offset


class PartitionCache:
    """Segments of one topic-id partition."""

    def __init__(self, tp: TopicIdPartition, owner: MetadataCache | None = None) -> None:
        self.tp = tp
        self._segments = SegmentTable()  # kept as their records where they came as records (`tier.segment_table`)
        self._epochs: dict[int, EpochIndex] = {}
        self._unreferenced: set[bytes] = set()
        self._owner = owner
        self._pending: list[bytes | int] | None = None  # deferred records, `DEFERRED` slots each
        self.at_once = False  # its records applied as they come (`MetadataCache.retire`)
        self.log_start_offset = 0  # moved by purges only (RemoteLogStartOffset): nothing below it is served
        # (producer id, first offset) → the recorded outcome of a transaction open at a tiered segment's end
        self.outcomes: dict[tuple[int, int], TransactionOutcome] = {}
        # the served segments' ids in offset order, their summary and the lineage, computed once per change of
        # `segments`/`epochs`, and the served segments made (within `MATERIALIZED`'s budget): every remote fetch
        # asks them (several times), a change comes once per tiered segment
        self._order: list[bytes] | None = None
        self._summary: tuple[int, int, int] | None = None
        self._served: list[RemoteLogSegmentMetadata] | None = None
        self._lineage: list[tuple[int, int, int]] | None = None
        # the served segments of a generation above 0 (replacements: `tier.replacement`), once there is one: what a
        # finished segment is checked against (a partition that never had one pays nothing)
        self._winners: Winners | None = None

    def _index(self) -> None:
        if self._pending is not None and self._owner is not None:
            self._owner.index(self)

    @property
    def segments(self) -> SegmentTable:
        """segment id → its metadata, every state but DELETE_SEGMENT_FINISHED."""
        if self._pending is not None:
            self._index()
        return self._segments

    @property
    def epochs(self) -> dict[int, EpochIndex]:
        """leader epoch → the served segments' starts in it."""
        if self._pending is not None:
            self._index()
        return self._epochs

    @property
    def unreferenced(self) -> set[bytes]:
        """Segments kept for cleanup but never served (unfinished, deleting, or a rival's loser)."""
        if self._pending is not None:
            self._index()
        return self._unreferenced

    def _changed(self) -> None:
        if self._served is not None:
            MATERIALIZED.drop(self)
        self._served = self._lineage = self._order = self._summary = None

    def forget_made(self) -> None:
        """Drop the made served segments (`MATERIALIZED`'s budget): made again when next asked."""
        self._served = None

    # --- events ------------------------------------------------------------------------------------------------
    def add(self, md: RemoteLogSegmentMetadata, record: bytes | None = None) -> None:
        """A segment's first event; `record`: the metadata record `md` was read from, kept in its place."""
        check_segment_transition(self.segments[md.segment_id.id].state if md.segment_id.id in self.segments else None,
                                 md.state, md.segment_id)
        self._put(md, record)
        self.unreferenced.add(md.segment_id.id)
        self._changed()

    def _put(self, md: RemoteLogSegmentMetadata, record: bytes | None) -> None:
        self._changed()  # (a record of a segment not seen before, as compaction leaves it, changed it too)
        if record is None:
            self.segments[md.segment_id.id] = md
        else:
            self.segments.put_record(md.segment_id.id, record)

    def update(self, up: RemoteLogSegmentMetadataUpdate, facts: RemoteLogSegmentMetadata | None = None,
               record: bytes | None = None) -> RemoteLogSegmentMetadata:
        """Apply a state change; `facts` (a full record, read from `record` if given) may correct what STARTED
        planned (the copied range)."""
        seg_id = up.segment_id.id
        current = self.segments.get(seg_id)
        check_segment_transition(current.state if current else None, up.state, up.segment_id)
        assert current is not None
        md = facts if facts is not None else current.with_update(up)
        self._changed()
        if up.state == SegmentState.DELETE_SEGMENT_FINISHED:
            del self.segments[seg_id]
            self.unreferenced.discard(seg_id)
            if self._winners is not None:
                self._winners.pop(seg_id)
            return md
        self._put(md, record if facts is not None else None)
        if up.state == SegmentState.COPY_SEGMENT_FINISHED:
            self._reference(md)
        elif up.state == SegmentState.DELETE_SEGMENT_STARTED:
            self._unindex(md)
            self.unreferenced.add(seg_id)
            if self._winners is not None and self._winners.pop(seg_id) is not None:
                self._unshadow(md)
        return md

    def _unindex(self, md: RemoteLogSegmentMetadata) -> None:
        for epoch, start, _ in md.epoch_ranges():
            idx = self.epochs.get(epoch)
            if idx is not None:
                idx.remove(start, md.segment_id.id)

    def _unshadow(self, gone: RemoteLogSegmentMetadata) -> None:
        """A replacement left before the segments it shadowed (deleted by retention, say): they are served again,
        unless others shadow them or win their place."""
        for seg_id in sorted(self.unreferenced):
            md = self.segments[seg_id]
            if md.state == SegmentState.COPY_SEGMENT_FINISHED and md.start_offset <= gone.end_offset \
                    and md.end_offset >= gone.start_offset:
                self._reference(md)

    def _shadowed_by_winner(self, md: RemoteLogSegmentMetadata) -> bool:
        winners = self._winners
        return winners is not None and covered(md, winners.over(md.start_offset, md.end_offset))

    def _shadow_below(self, md: RemoteLogSegmentMetadata) -> None:
        """Unreference the served segments that `md` (a replacement) and the served replacements cover."""
        assert self._winners is not None
        losers = set()
        for idx in self.epochs.values():  # the served segments overlapping `md`: starting inside it, or before
            lo = max(0, bisect.bisect_left(idx.starts, md.start_offset) - 1)
            hi = bisect.bisect_right(idx.starts, md.end_offset)
            for start in idx.starts[lo:hi]:
                other = idx.ids[start]
                found = self.segments[other]
                if other != md.segment_id.id and covered(found, self._winners.over(found.start_offset,
                                                                                   found.end_offset)):
                    losers.add(other)
        for other in losers:
            self._unindex(self.segments[other])
            self.unreferenced.add(other)
            self._winners.pop(other)

    def _reference(self, md: RemoteLogSegmentMetadata) -> None:
        seg_id = md.segment_id.id
        if self._shadowed_by_winner(md):
            self.unreferenced.add(seg_id)
            return
        if generation(md):
            if self._winners is None:
                self._winners = Winners()
            self._winners.add(md)
            self._shadow_below(md)
        self.unreferenced.discard(seg_id)
        for epoch, start, _ in md.epoch_ranges():
            idx = self.epochs.get(epoch)
            if idx is None:
                idx = self.epochs[epoch] = EpochIndex()
            old = idx.ids.get(start)
            if old is not None and old != seg_id:
                rival = self.segments[old]
                if (generation(rival), rival.broker_leader_epoch, rival.event_timestamp_ms) > (
                        generation(md), md.broker_leader_epoch, md.event_timestamp_ms):
                    self.unreferenced.add(seg_id)
                    continue
                self.unreferenced.add(old)
            idx.put(start, seg_id)

    # --- queries -----------------------------------------------------------------------------------------------
    def finished(self) -> Iterator[RemoteLogSegmentMetadata]:
        """Served segments (COPY_SEGMENT_FINISHED and referenced), in offset order."""
        if self._pending is not None:
            self._index()  # (what is made below is kept until a change: deferred records are changes)
        served = self._served
        if served is None:
            served = self._served = [self.segments[i] for i in self._served_ids()]
            MATERIALIZED.touch(self, len(served))
        else:
            MATERIALIZED.touch(self)
        return iter(served)

    def _served_ids(self) -> list[bytes]:
        if self._pending is not None:
            self._index()
        if self._order is None:
            ids = {i for idx in self.epochs.values() for i in idx.ids.values()}
            facts = {i: self.segments.facts(i) for i in ids}
            self._order = sorted(ids, key=lambda i: facts[i][:2])
            self._summary = (len(ids), sum(f[3] for f in facts.values()),
                             max((f[2] for f in facts.values()), default=0))
        return self._order

    def summary(self) -> tuple[int, int, int]:
        """(served segments, their bytes, the newest one's event time in ms; 0 when none), without making them."""
        self._served_ids()
        assert self._summary is not None
        return self._summary

    def shadowed(self) -> list[RemoteLogSegmentMetadata]:
        """Finished segments a served replacement takes the place of (`tier.replacement`), in offset order: what
        the tier job marks for deletion next."""
        unreferenced = self.unreferenced  # (deferred records applied first)
        winners = self._winners
        if not winners:
            return []
        out = [md for i in unreferenced if (md := self.segments[i]).state == SegmentState.COPY_SEGMENT_FINISHED
               and covered(md, winners.over(md.start_offset, md.end_offset))]
        return sorted(out, key=lambda m: m.start_offset)

    def all_segments(self) -> list[RemoteLogSegmentMetadata]:
        return sorted(self.segments.values(), key=lambda m: (m.start_offset, m.end_offset))

    def segments_for_epoch(self, epoch: int) -> list[RemoteLogSegmentMetadata]:
        idx = self.epochs.get(epoch)
        return [] if idx is None else [self.segments[idx.ids[s]] for s in idx.starts]

    def segment_for(self, offset: int, leader_epoch: int) -> RemoteLogSegmentMetadata | None:
        if offset < self.log_start_offset:
            return None  # purged
        idx = self.epochs.get(leader_epoch)
        seg_id = idx.floor(offset) if idx is not None else None
        if seg_id is None:
            return None
        md = self.segments[seg_id]
        for epoch, start, end in md.epoch_ranges():
            if epoch == leader_epoch and start <= offset <= end:
                return md
        return None

    def segment_for_offset(self, offset: int) -> RemoteLogSegmentMetadata | None:
        """The served segment holding `offset`, whatever its epoch (the consumer fetch path)."""
        epoch = self.epoch_for_offset(offset)
        return None if epoch is None else self.segment_for(offset, epoch)

    def lineage(self) -> list[tuple[int, int, int]]:
        """(epoch, first offset, last offset) over the served segments, in epoch order."""
        if self._pending is not None:
            self._index()
        if self._lineage is None:
            self._lineage = self._compute_lineage()
        return self._lineage

    def _compute_lineage(self) -> list[tuple[int, int, int]]:
        ranges: dict[int, list[int]] = {}
        served = {md.segment_id.id: md for md in self.finished()}
        for epoch, idx in self.epochs.items():
            for start in idx.starts:
                md = served[idx.ids[start]]
                for e, s, end in md.epoch_ranges():
                    if e == epoch:
                        lo_hi = ranges.setdefault(epoch, [s, end])
                        lo_hi[0], lo_hi[1] = min(lo_hi[0], s), max(lo_hi[1], end)
        return sorted(((e, lo, hi) for e, (lo, hi) in ranges.items()), key=lambda t: t[0])

    def epoch_for_offset(self, offset: int) -> int | None:
        for epoch, lo, hi in reversed(self.lineage()):
            if lo <= offset <= hi:
                return epoch
        return None

    def highest_offset_for_epoch(self, epoch: int) -> int | None:
        ends = [end for md in self.segments_for_epoch(epoch) for e, _, end in md.epoch_ranges() if e == epoch]
        return max(ends) if ends else None

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int] | None:
        """OffsetForLeaderEpoch over the tier: (largest epoch ≤ `epoch`, its end offset = next epoch's start)."""
        lineage = self.lineage()
        older = [t for t in lineage if t[0] <= epoch]
        if not older:
            return None
        e, _, hi = older[-1]
        later = [t for t in lineage if t[0] > e]
        return e, (later[0][1] if later else hi + 1)

    def next_segment_after(self, offset: int) -> RemoteLogSegmentMetadata | None:
        """The first served segment starting above `offset` (where a read inside a hole may go on)."""
        return next((md for md in self.finished() if md.start_offset > offset), None)

    def holes(self) -> list[tuple[int, int]]:
        """[first missing, next start) between served segments, oldest first: what a failed copy left behind while
        later copies of its pass succeeded. The next tiering pass fills them while the broker still has them."""
        return holes_between(self.finished())

    def earliest_offset(self) -> int | None:
        """The first offset the tier serves: its oldest segment's start, or the purged log start inside it."""
        return tier_start(served_segments(self.finished(), self.log_start_offset), self.log_start_offset)

    def purge_below(self, log_start_offset: int) -> bool:
        """Raise the log start (a purge); False if it is not above the current one (log starts only move up)."""
        if log_start_offset <= self.log_start_offset:
            return False
        self.log_start_offset = log_start_offset
        return True

    def purged(self) -> list[RemoteLogSegmentMetadata]:
        """Served segments wholly below the log start: never served again, to be deleted."""
        return [md for md in self.finished() if md.end_offset < self.log_start_offset]

    def latest_tiered_offset(self) -> int:
        ends = [md.end_offset for md in self.finished()]
        return max(ends) if ends else -1


class MetadataCache:
    """Every partition's segments and deletion state; `apply` validates each event against the state machine."""

    def __init__(self) -> None:
        self.partitions: dict[PartitionKey, PartitionCache] = {}
        self._by_name: dict[tuple[str, int], list[PartitionKey]] = {}  # (topic, partition) → its ids, oldest first
        self.deletions: dict[PartitionKey, RemotePartitionDeleteMetadata] = {}
        self.pass_requested: TierPass | None = None  # the latest tiering pass asked for (admin API)
        self.pass_done: TierPass | None = None  # the latest pass that served a request
        self._events_applied = 0
        self._unindexed: set[PartitionCache] = set()  # partitions holding deferred records
        self._deferred_to: dict[bytes, PartitionCache] = {}  # the partition as a segment record names it → its cache
        self.skipped: Skipped | None = None  # told of a deferred record that failed when applied (the view's log)
        # the thread loading the view (a checkpoint, on a worker thread while the loop answers): only it applies
        # deferred records meanwhile; a read from another thread (a /metrics scrape) finds them not read yet, as
        # a view still loading is (an apply there raced the loader's keeping of a record, and lost it)
        self.loader: int | None = None
        self.mounts: dict[bytes, TopicMount] = {}  # origin topic id → its mount (a restore's hand-over)
        self.aliases: dict[bytes, bytes] = {}  # a restored topic's id in the owning cluster → the history's id

    def origin(self, topic_id: bytes) -> bytes:
        """The id the tier keeps `topic_id`'s history under: the origin id when it is a restored topic's alias."""
        return self.aliases.get(topic_id, topic_id)

    def inherited(self, topic_id: bytes) -> bool:
        """An id the tier holds from a cluster that is gone: only its alias (if any) can be proven deleted."""
        return topic_id in self.mounts

    def partition(self, tp: TopicIdPartition) -> PartitionCache:
        key = (tp.topic_id, tp.partition)
        pc = self.partitions.get(key)
        if pc is None:
            pc = self.partitions[key] = PartitionCache(tp, self)
            self._by_name.setdefault((tp.topic, tp.partition), []).append(key)
        return pc

    def get(self, topic_id: bytes, partition: int) -> PartitionCache | None:
        """By id: the cluster's id of a restored topic finds the history it continues."""
        return self.partitions.get((self.aliases.get(topic_id, topic_id), partition))

    def apply_record(self, md: RemoteLogSegmentMetadata, record: bytes | None = None) -> None:
        """A full segment record carrying any state, as the metadata topic stores each event (`record`: its bytes,
        which `md` was read from: kept instead of `md`).

        Known segments move through the state machine as usual. An unknown segment in a later state is what
        compaction leaves of its history (earlier records shared its key and were compacted away): it is taken
        as it stands.
        """
        pc = self.partition(md.tp)
        known = md.segment_id.id in pc.segments
        if md.state == SegmentState.COPY_SEGMENT_STARTED or known:
            if md.state == SegmentState.COPY_SEGMENT_STARTED:
                pc.add(md, record)
            else:
                pc.update(RemoteLogSegmentMetadataUpdate(md.segment_id, md.event_timestamp_ms, md.state, md.broker_id,
                                                         md.custom_metadata, md.broker_leader_epoch, md.end_offset),
                          md, record)
        elif md.state != SegmentState.DELETE_SEGMENT_FINISHED:
            pc._put(md, record)
            if md.state == SegmentState.COPY_SEGMENT_FINISHED:
                pc._reference(md)
            else:
                pc.unreferenced.add(md.segment_id.id)
        self._events_applied += 1

    @property
    def events_applied(self) -> int:
        """Events applied (deferred records counted once applied: all are, first)."""
        self.index_all()
        return self._events_applied

    def defer(self, value: bytes, key: bytes, source: int = -1, offset: int = -1) -> bool:
        """Keep a segment record to apply when its partition is first read; False: not a segment record whose
        partition a glance finds (apply it now). `key`, `source`, `offset`: its key and where it was read (what
        the `skipped` hook is told)."""
        if len(value) < 80 or value[0] or not 0 < value[2] < 128:
            return False
        pc = self._deferred_to.get(value[2:value[2] + 22])  # (a value cut short: a slice no partition names)
        if pc is None:
            tp = partition_named(value, shared_tip)  # (its shape checked whole)
            if tp is None:
                return False
            pc = self.partitions.get((tp.topic_id, tp.partition))
            if pc is None:  # the partition's first record: made as at once, only for a record that reads
                try:
                    decode_value(value)
                except (ValueError, ProtocolError):
                    return False  # (applied now: skipped as malformed, and no partition made for it)
                pc = self.partition(tp)
            self._deferred_to[value[2:value[2] + 22]] = pc
        if pc.at_once:
            return False
        pending = pc._pending
        if pending is None:
            pending = pc._pending = []
            self._unindexed.add(pc)
        pending += (key, value, source, offset)
        return True

    def index(self, pc: PartitionCache) -> None:
        """Apply `pc`'s deferred records, in the order they came (a record that fails is skipped, as when applied
        at once, and told to `skipped`)."""
        if self.loader is not None and self.loader != threading.get_ident():
            return
        pending, pc._pending = pc._pending, None
        self._unindexed.discard(pc)
        if not pending:
            return
        for i in range(0, len(pending), DEFERRED):
            key, value, source, offset = pending[i:i + DEFERRED]
            assert isinstance(key, bytes) and isinstance(value, bytes)
            assert isinstance(source, int) and isinstance(offset, int)
            try:
                md = decode_value(value)
                assert isinstance(md, RemoteLogSegmentMetadata)  # (what `defer` takes: api key 0)
                self.apply_record(md, value)
            except (IllegalStateTransition, ValueError, ProtocolError) as exc:
                if self.skipped is not None:
                    self.skipped(key, value, source, offset, exc)

    def retire(self, live: bytes, value: bytes | None) -> None:
        """The live record `live` is leaving the live records (`value`: what its key holds next; None: a tombstone),
        which a checkpoint replays. Its partition's deferred records are applied first; and if a segment's state
        rests on `live` alone (no later record of it, and `value` is not one), the partition applies what comes at
        once from then on: a record kept meanwhile would be replayed at the next start without that state, and
        may pass there where it failed (a segment being deleted served again)."""
        try:
            event = decode_value(live)
        except (ValueError, ProtocolError):
            return
        if isinstance(event, RemoteLogSegmentMetadataUpdate):
            tp, seg_id = event.segment_id.tp, event.segment_id.id
        elif isinstance(event, RemoteLogSegmentMetadata):
            tp, seg_id = event.tp, event.segment_id.id
        else:
            return  # (no segment's state: what a segment record meets does not depend on it)
        pc = self.partitions.get((tp.topic_id, tp.partition))
        if pc is None:
            return
        if pc._pending is not None:
            self.index(pc)
        same = value is not None and len(value) > 2 and live[2:live[2] + 38] == value[2:value[2] + 38]
        if not same and pc._segments.rests_on(seg_id, live):
            pc.at_once = True

    def index_all(self) -> None:
        """Apply every partition's deferred records (none from another thread while one loads the view)."""
        if self.loader is not None and self.loader != threading.get_ident():
            return
        while self._unindexed:
            self.index(next(iter(self._unindexed)))

    async def index_gradually(self) -> None:
        """Apply every partition's deferred records, one partition per turn of the event loop: what a /metrics
        scrape or the status page awaits before it sums them all (clients' requests are answered meanwhile; a
        million segments take seconds). Records arriving meanwhile are left to the sums' own `index`."""
        for pc in list(self._unindexed):
            if pc._pending is not None:
                self.index(pc)
                await asyncio.sleep(0)

    def _drop(self, key: PartitionKey) -> None:
        gone = self.partitions.pop(key, None)
        if gone is not None:
            self._deferred_to.clear()
            named = self._by_name.get((gone.tp.topic, gone.tp.partition), [])
            named.remove(key)
            if not named:
                del self._by_name[(gone.tp.topic, gone.tp.partition)]

    def apply(self, event: RemoteLogSegmentMetadata | RemoteLogSegmentMetadataUpdate
              | RemotePartitionDeleteMetadata | RemoteLogStartOffset | TierPass | TopicMount
              | TransactionOutcome) -> None:
        if isinstance(event, TransactionOutcome):
            if not self.is_deleted(event.tp.topic_id, event.tp.partition):
                outcomes = self.partition(event.tp).outcomes
                known = outcomes.get((event.producer_id, event.first_offset))
                if known is None or not known.decided:  # a decided outcome is final
                    outcomes[(event.producer_id, event.first_offset)] = event
        elif isinstance(event, TopicMount):
            old = self.mounts.get(event.origin_id)
            if old is not None:
                self.aliases.pop(old.alias_id, None)
            self.mounts[event.origin_id] = event
            if event.mounted:
                self.aliases[event.alias_id] = event.origin_id
        elif isinstance(event, TierPass):
            if event.requested:
                self.pass_requested = event
            else:
                self.pass_done = event
        elif isinstance(event, RemoteLogStartOffset):
            if not self.is_deleted(event.tp.topic_id, event.tp.partition):
                self.partition(event.tp).purge_below(event.log_start_offset)
        elif isinstance(event, RemoteLogSegmentMetadata):
            self.partition(event.tp).add(event)
        elif isinstance(event, RemoteLogSegmentMetadataUpdate):
            self.partition(event.segment_id.tp).update(event)
        else:
            key = (event.tp.topic_id, event.tp.partition)
            current = self.deletions.get(key)
            check_partition_transition(current.state if current else None, event.state, event.tp)
            self.deletions[key] = event
            if event.state == PartitionDeleteState.DELETE_PARTITION_FINISHED:
                gone = self.partitions.get(key)
                if gone is not None:
                    gone._index()  # what it deferred is applied (and any failure told) before it goes
                self._drop(key)
        self._events_applied += 1

    def find(self, topic: str, partition: int) -> PartitionCache | None:
        """By topic name (the newest id if a name was reused and both are known)."""
        found = [key for key in self._by_name.get((topic, partition), ()) if not self.is_deleted(*key)]
        return self.partitions[found[-1]] if found else None  # (an index: a fetch names 10,000 partitions)

    def is_deleted(self, topic_id: bytes, partition: int) -> bool:
        return (self.aliases.get(topic_id, topic_id), partition) in self.deletions

    def pass_pending(self, now_ms: int) -> TierPass | None:
        """The tiering pass asked for that is still to be taken at `now_ms` (None: none): no tier job took it, its
        asker did not withdraw it, and it has not expired. An abandoned request expires: it never blocks a later
        one, and no job runs it long after its asker stopped waiting."""
        asked, done = self.pass_requested, self.pass_done
        if asked is None or (done is not None and done.request_id == asked.request_id):
            return None
        return None if 0 <= asked.expires_ms <= now_ms else asked
