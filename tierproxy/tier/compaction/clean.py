"""One cleaning of a partition's tier (Kafka's Cleaner.doClean): map the dirty segments' keys into a bounded
map, then recopy every segment the map covers through the filter, group by group, into new segments."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from protocol.records import CONTROL_BIT, TRANSACTIONAL_BIT, RecordBatch, iter_batches, scan_records
from tierproxy.tier.compaction.filter import RecordFilter
from tierproxy.tier.compaction.kernel import PYTHON, RecordKernel
from tierproxy.tier.compaction.model import CleanedSegment, CleanerConfig, CleaningPlan, SegmentInput, TierSegment
from tierproxy.tier.compaction.offset_map import OffsetMap
from tierproxy.tier.compaction.producers import ProducerTracker
from tierproxy.tier.compaction.txn import CleanedTransactions, collect_aborted
from tierproxy.tier.indexes import (
    AbortedTxn,
    ProducerEntry,
    SegmentBuilder,
    encode_leader_epochs,
    encode_producer_snapshot,
    encode_txn_index,
)


class MapTooSmall(ValueError):
    """The key map cannot hold the keys of one batch: the cleaning cannot progress."""


def clean_partition(plan: CleaningPlan, read_segment: Callable[[TierSegment], SegmentInput], now_ms: int,
                    config: CleanerConfig, *, map_bytes: int,
                    read_aborted: Callable[[TierSegment], Sequence[AbortedTxn]] | None = None,
                    kernel: RecordKernel = PYTHON) -> Iterator[CleanedSegment]:
    """Run one cleaning: the new segments, in offset order, each replacing one group of the plan.

    `map_bytes` bounds the key map (Kafka's log.cleaner.dedupe.buffer.size); when the map fills, the cleaning
    covers what the map covered — up to the last whole batch it mapped — and the rest waits for the next pass,
    as Kafka's cleaner does (groups past it are not yielded; the group it stopped in is still replaced whole, in
    two pieces, see CleanedSegment). A transaction the segments hold no marker for bounds the cleaning at the
    segment it begins in, as the LSO bounds Kafka's. `read_segment` is called up to twice for a segment (the map
    pass, then the copy pass; a third time when such a transaction makes the map be built again) and once for
    each of `plan.later` (their producers); `read_aborted` (default: `read_segment(s).aborted`) gives a segment's
    txn index. `kernel`: the per-record loops (`kernel.PYTHON`, the reference, or the tier job's compiled one:
    both give the same bytes)."""
    segs = plan.segments
    upper = plan.first_uncleanable_offset
    aborted_of = read_aborted or (lambda s: read_segment(s).aborted)
    txn_indexes = [(s.start_offset, list(aborted_of(s))) for s in (*segs, *plan.later)]
    offsets = OffsetMap(map_bytes)
    expiration = config.producer_id_expiration_ms
    tracker = ProducerTracker(now_ms, expiration)
    dirty = [s for s in segs if s.start_offset >= plan.first_dirty_offset]
    for s in segs:
        if s.start_offset < plan.first_dirty_offset:
            _track(tracker, read_segment(s), 0)
    end = _build_map(dirty, read_segment, offsets, tracker, txn_indexes, plan.first_dirty_offset, upper, kernel)
    for s in dirty:  # batches past where the map stopped: their producers count too
        if s.end_offset >= end:
            _track(tracker, read_segment(s), end)
    for s in plan.later:
        _track(tracker, read_segment(s), 0)
    undecided = tracker.first_undecided()
    if undecided is not None and undecided < end:
        # a transaction whose marker the tier does not hold yet (the broker's LSO is past it): Kafka's cleaner
        # never maps an undecided transaction, so the map is built again up to the segment it begins in
        upper = max((s.start_offset for s in segs if s.start_offset <= undecided), default=0)
        if upper <= plan.first_dirty_offset:
            return
        offsets.clear()
        end = _build_map([s for s in dirty if s.start_offset < upper], read_segment, offsets,
                         ProducerTracker(now_ms, expiration), txn_indexes, plan.first_dirty_offset, upper, kernel)
    flt = RecordFilter(now_ms, config.delete_retention_ms, offsets, CleanedTransactions(),
                       tracker.active(), upper, kernel=kernel)
    for group in plan.groups:
        if group[0].start_offset >= end:
            return
        yield from _clean_group(group, read_segment, flt, txn_indexes, end)
        if end <= group[-1].end_offset:
            return  # the rest waits for the next cleaning


def _track(tracker: ProducerTracker, inp: SegmentInput, start: int) -> None:
    for b in iter_batches(inp.log):
        h = b.header()
        if h.base_offset >= start:
            tracker.add(h)


def _build_map(dirty: Sequence[TierSegment], read_segment: Callable[[TierSegment], SegmentInput],
               offsets: OffsetMap, tracker: ProducerTracker, txn_indexes: list[tuple[int, list[AbortedTxn]]],
               start: int, upper: int, kernel: RecordKernel) -> int:
    """Kafka's buildOffsetMap over [start, upper); the first offset the map does not cover (upper when all)."""
    txns = CleanedTransactions()
    txns.add_aborted(collect_aborted(txn_indexes, start, upper))
    for i, seg in enumerate(dirty):
        next_start = dirty[i + 1].start_offset if i + 1 < len(dirty) else upper
        for batch in iter_batches(read_segment(seg).log):
            h = batch.header()
            last = h.base_offset + h.last_offset_delta
            if h.attributes & CONTROL_BIT:
                section, spans = scan_records(batch)
                ctype = int.from_bytes(section[spans[0][2] + 2:spans[0][2] + 4], "big", signed=True) \
                    if spans and spans[0][3] >= 4 else None
                txns.on_control_batch(batch, ctype)
            elif not txns.on_data_batch(bool(h.attributes & TRANSACTIONAL_BIT), h.producer_id, last):
                keyed = kernel.map_batch(batch, h, start, offsets)
                if keyed < 0:  # the batch's keys would take the map past its size: none were put
                    if offsets.latest_offset < start:
                        raise MapTooSmall(f"the key map holds {offsets.max_entries} keys, fewer than the "
                                          f"{-keyed - 1} of the batch at offset {h.base_offset}: raise its bytes")
                    return offsets.latest_offset + 1  # Kafka's map is full: the cleaning ends here
            tracker.add(h)
            if last >= start:
                offsets.latest_offset = last
        offsets.latest_offset = next_start - 1  # gaps: the segment covers up to the next one
    return upper


def _clean_group(group: tuple[TierSegment, ...], read_segment: Callable[[TierSegment], SegmentInput],
                 flt: RecordFilter, txn_indexes: list[tuple[int, list[AbortedTxn]]],
                 end: int) -> Iterator[CleanedSegment]:
    """Kafka's cleanSegments: the group's segments through the filter into one new segment — two when the map
    (or an undecided transaction) ended inside the group, so that the group is still replaced whole: what the
    map covered, then the rest (the segment it ended in filtered, as Kafka cleans it; the segments wholly past
    it as they are, as Kafka leaves them)."""
    out = _Output(group, group[0].start_offset)
    flt.txns.index = out.txn_entries
    entries = dict(txn_indexes)
    for i, seg in enumerate(group):
        inp = read_segment(seg)
        if seg.start_offset >= end:  # wholly past what the map covered: carried as it is
            if out.replaces:
                yield out.finish(end - 1, cleaned=True)
                out = _Output((), end)
            for batch in iter_batches(inp.log):
                out.add(batch, batch.view())
            out.txn_entries += entries.get(seg.start_offset, [])
            out.producers = dict(inp.producers)
            continue
        nxt = group[i + 1].start_offset if i + 1 < len(group) else seg.end_offset + 1
        flt.txns.add_aborted(collect_aborted(txn_indexes, seg.start_offset, nxt))
        for batch in iter_batches(inp.log):
            if out.replaces and batch.base_offset >= end:  # the map stopped in this segment: split it here
                out.producers = {}  # a piece ending inside a source segment: the state its own batches give
                yield out.finish(end - 1, cleaned=True)
                out = _Output((), end)
                flt.txns.index = out.txn_entries
            out.add(batch, flt.apply(batch))
        out.producers = dict(inp.producers)  # the state at this segment's end, as the source recorded it
    if out.replaces or out.start <= group[-1].end_offset:
        yield out.finish(group[-1].end_offset, cleaned=bool(out.replaces))


class _Output:
    """The batches kept for one new segment, the source's leader epochs and the kept txn index entries."""

    def __init__(self, replaces: tuple[TierSegment, ...], start: int) -> None:
        self.replaces = replaces
        self.start = start
        self.kept: list[RecordBatch] = []
        self.epochs: dict[int, int] = {}
        self.producers: dict[int, ProducerEntry] = {}
        self.txn_entries: list[AbortedTxn] = []

    def add(self, source: RecordBatch, kept: bytes | memoryview | None) -> None:
        epoch = source.partition_leader_epoch
        if epoch >= 0 and (not self.epochs or epoch > max(self.epochs)):
            self.epochs[epoch] = source.base_offset
        if kept is not None:
            self.kept.append(RecordBatch(memoryview(kept)))

    def finish(self, end_offset: int, *, cleaned: bool) -> CleanedSegment:
        files = None
        if self.kept:
            b = SegmentBuilder(base_offset=self.start)  # indexes relative to the replaced segment's base
            for batch in self.kept:
                b.add(batch)
            files = b.finish()
            files.end_offset = end_offset  # the range replaced, whose last batches may be gone
            files.txn_index, files.aborted = encode_txn_index(self.txn_entries), list(self.txn_entries)
            files.leader_epochs, files.leader_epoch_checkpoint = dict(self.epochs), encode_leader_epochs(self.epochs)
            if self.producers:  # ends where a source segment ends: its producer snapshot holds
                files.producers = self.producers
                files.producer_snapshot = encode_producer_snapshot(self.producers)
        return CleanedSegment(replaces=self.replaces, start_offset=self.start, end_offset=end_offset, files=files,
                              max_timestamp_ms=files.max_timestamp_ms if files else -1,
                              leader_epochs=dict(self.epochs), size=files.log_size if files else 0,
                              cleaned=cleaned)
