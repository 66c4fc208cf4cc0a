"""Building blocks for tier compaction tests: a partition's tier as segments in memory, cleaned by the engine,
and its batches decoded back into plain tuples."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from protocol.records import (
    ABORT,
    COMMIT,
    CONTROL_BIT,
    CONTROL_KEY,
    DELETE_HORIZON_BIT,
    TRANSACTIONAL_BIT,
    Record,
    RecordBatch,
    build_batch,
    build_control_batch,
    iter_batches,
)
from tierproxy.jobs.tiering.compact import best_kernel
from tierproxy.tier.compaction import (
    CleanedSegment,
    CleanerConfig,
    SegmentInput,
    TierSegment,
    clean_partition,
    plan_cleaning,
)
from tierproxy.tier.compaction.kernel import RecordKernel
from tierproxy.tier.indexes import ProducerEntry, SegmentBuilder, SegmentFiles

KEYS = [b"k%d" % i for i in range(6)]
PLAIN = -1


@dataclass(frozen=True)
class Batch:
    """A batch as the tests compare them: offsets, producer, flags, records and the delete horizon."""

    base: int
    last: int
    pid: int
    txn: bool
    control: int | None  # ABORT/COMMIT for a marker with its record, -1 for an empty control batch
    records: tuple[tuple[int, bytes | None, bytes | None], ...]
    horizon: int | None


def decode(log: bytes | memoryview) -> list[Batch]:
    out = []
    for b in iter_batches(log):
        assert b.crc_ok(), f"batch at {b.base_offset}: bad CRC"
        h = b.header()
        recs = tuple((r.offset, r.key, r.value) for r in b.records())
        control = None
        if h.attributes & CONTROL_BIT:
            control = CONTROL_KEY.unpack(recs[0][1] or b"")[1] if recs else -1
        out.append(Batch(h.base_offset, h.base_offset + h.last_offset_delta, h.producer_id,
                         bool(h.attributes & TRANSACTIONAL_BIT), control, recs,
                         h.base_timestamp if h.attributes & DELETE_HORIZON_BIT else None))
    return out


class Tier:
    """A partition's tier in memory: segments in offset order with their files, cleaned by the engine."""

    def __init__(self, config: CleanerConfig, kernel: RecordKernel | None = None) -> None:
        self.config = config
        self.kernel = kernel or best_kernel(True)  # the tier job's default: the compiled loops
        self.segments: list[tuple[TierSegment, SegmentInput]] = []
        self.producers: dict[int, ProducerEntry] = {}  # carried across appended segments (open transactions)
        self._ids = 0

    def append(self, batches: Sequence[bytes]) -> None:
        """One new (dirty) segment of raw batches, as the tier job copies it."""
        b = SegmentBuilder(self.producers)
        for raw in batches:
            b.add(RecordBatch(memoryview(raw)))
        files = b.finish()
        self.producers = files.producers
        self._add(files, cleaned=False)

    def _add(self, files: SegmentFiles, *, cleaned: bool, start: int | None = None, end: int | None = None) -> None:
        self._ids += 1
        seg = TierSegment(self._ids.to_bytes(16, "big"), files.start_offset if start is None else start,
                          files.end_offset if end is None else end, files.max_timestamp_ms, files.log_size, cleaned)
        self.segments.append((seg, SegmentInput(files.log, files.aborted, files.producers)))

    def clean(self, now_ms: int, map_bytes: int = 1 << 20, last_stable_offset: int | None = None,
              on_read: Callable[[TierSegment], None] | None = None,
              kernel: RecordKernel | None = None) -> list[CleanedSegment] | None:
        """One cleaning (if due); the tier then holds the new segments in place of those they replace.
        `on_read` is called before the engine reads each segment (a benchmark's clock: map pass, then copy)."""
        plan = plan_cleaning([s for s, _ in self.segments], now_ms, self.config,
                             last_stable_offset=last_stable_offset)
        if plan is None:
            return None
        inputs = {s.segment_id: i for s, i in self.segments}

        def read(s: TierSegment) -> SegmentInput:
            if on_read is not None:
                on_read(s)
            return inputs[s.segment_id]

        out = list(clean_partition(plan, read, now_ms, self.config, map_bytes=map_bytes,
                                   kernel=kernel or self.kernel))
        gone = {s.segment_id for c in out for s in c.replaces}  # a split's second piece names none
        kept = [(s, i) for s, i in self.segments if s.segment_id not in gone]
        for c in out:
            if c.files is not None:
                self._add(c.files, cleaned=c.cleaned, start=c.start_offset, end=c.end_offset)
        new = self.segments[len(self.segments) - sum(c.files is not None for c in out):]
        self.segments = sorted(kept + new, key=lambda si: si[0].start_offset)
        return out

    def log(self) -> bytes:
        return b"".join(bytes(i.log) for _, i in self.segments)

    def batches(self) -> list[Batch]:
        return decode(self.log())


def latest_values(batches: Sequence[Batch]) -> dict[bytes | None, tuple[int, bytes | None]]:
    """key → (offset, value) of what a consumer reading the log from the start ends with (aborted skipped:
    the batches given hold no aborted records)."""
    out: dict[bytes | None, tuple[int, bytes | None]] = {}
    for b in batches:
        if b.control is None:
            for off, k, v in b.records:
                out[k] = (off, v)
    return out


class History:
    """A generated partition history: raw batches with consecutive offsets, one timestamp a round."""

    def __init__(self, keys: Sequence[bytes] = tuple(KEYS)) -> None:
        self.keys = list(keys)
        self.next = 0
        self.seq: dict[int, int] = {}
        self.n = 0

    def _records(self, ops: list[tuple[int, bool]], ts: int) -> list[Record]:
        out = []
        for key, has_value in ops:
            self.n += 1
            out.append(Record(self.next + len(out), ts, self.keys[key], b"v%d" % self.n if has_value else None))
        return out

    def data(self, pid: int, ops: list[tuple[int, bool]], ts: int, codec: int = 0, txn: bool = False) -> bytes:
        recs = self._records(ops, ts)
        seq = self.seq.get(pid, 0)
        raw = build_batch(recs, base_offset=self.next, codec=codec, producer_id=pid,
                          producer_epoch=0 if pid >= 0 else -1, base_sequence=seq if pid >= 0 else -1,
                          transactional=txn)
        self.seq[pid] = seq + len(recs)
        self.next += len(recs)
        return raw

    def marker(self, pid: int, kind: int, ts: int) -> bytes:
        raw = build_control_batch(kind, offset=self.next, producer_id=pid, producer_epoch=0, timestamp=ts)
        self.next += 1
        return raw

    def chunk(self, steps: list[tuple], ts: int) -> list[bytes]:  # type: ignore[type-arg]
        """The batches of one round's steps; a transaction's batches interleave with the next plain put."""
        out: list[bytes] = []
        for s in steps:
            if s[0] == "put":
                out.append(self.data(s[1], s[2], ts, s[3]))
            else:
                _, pid, n, commit = s
                for i in range(n):
                    out.append(self.data(pid, [(i % len(self.keys), i % 3 != 2)], ts, txn=True))
                    out.append(self.data(PLAIN, [((i + 2) % len(self.keys), True)], ts))
                out.append(self.marker(pid, COMMIT if commit else ABORT, ts))
        return out
