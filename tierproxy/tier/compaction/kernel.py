"""The per-record work of a cleaning, behind one small interface: map a batch's keys, decide which of its records
are retained, rebuild a batch of those. `PYTHON` is the reference; the tier job passes a compiled one (numba,
`tierproxy.jobs.tiering.compaction_kernel`) when it can be imported: both decide exactly the same (the rules are
written once here, in `retain_record`, and mirrored by the compiled loop; differential tests hold them together).

Why an interface handed in rather than imported: the engine lives in `tier/`, which the proxy imports without the
`tier` extra (numba, numpy); the job that has the extra chooses the kernel.
"""

from __future__ import annotations

from typing import Any, Protocol

from protocol.errors import ProtocolError
from protocol.records import DELETE_HORIZON_BIT, BatchHeader, RecordBatch, RecordSpan, rebuild_batch, scan_records
from tierproxy.tier.compaction.offset_map import OffsetMap


class Retained(Protocol):
    """Which records of one data batch a filter keeps."""

    total: int  # records in the batch
    kept: int  # records retained
    tombstones: bool  # whether a retained record is a tombstone


class RecordKernel(Protocol):
    """The per-record loops of the map build and the filter (see the module docstring)."""

    def map_batch(self, batch: RecordBatch, h: BatchHeader, start: int, offsets: OffsetMap) -> int:
        """Put the keys of the batch's records at offsets ≥ `start` into `offsets`, returning how many there were;
        when they would take the map past `max_entries`, put none and return -(how many) - 1."""

    def retain(self, batch: RecordBatch, h: BatchHeader, offsets: OffsetMap, now_ms: int) -> Retained:
        """Kafka's shouldRetainRecord over every record of a (non-control) data batch."""

    def rebuild(self, h: BatchHeader, retained: Any, delete_horizon_ms: int) -> bytes:
        """The batch of the retained records (`retained.kept` ≥ 1), as `protocol.records.rebuild_batch`."""


def check_base_offset(h: BatchHeader) -> None:
    """Raise ProtocolError when the batch's offsets (base + an int offset delta) could pass a long: the compiled
    loop's sums would wrap where the reference's do not (a record kept by one, dropped by the other)."""
    if not -2**63 + 2**31 <= h.base_offset <= 2**63 - 2**31:
        raise ProtocolError(f"batch at {h.base_offset}: its offsets could run past a 64-bit long")


def retain_record(offset: int, latest_offset: int, key_length: int, mapped: int, has_value: bool,
                  has_horizon: bool, now_ms: int, horizon_ms: int) -> bool:
    """Kafka's Cleaner.shouldRetainRecord for a v2 record (`mapped`: the map's offset for its key, -1 none)."""
    if offset > latest_offset:
        return True
    if key_length < 0:
        return False  # a record without a key in a compacted log: invalid, dropped
    if offset < mapped:
        return False
    return has_value or not has_horizon or now_ms < horizon_ms


class _PyRetained:
    __slots__ = ("kept", "section", "spans", "tombstones", "total")

    def __init__(self, section: bytes, spans: list[RecordSpan], total: int) -> None:
        self.section, self.spans, self.total = section, spans, total
        self.kept = len(spans)
        self.tombstones = any(not s[4] for s in spans)


class PythonKernel:
    """The reference: `scan_records`, `OffsetMap.put/get` and `retain_record` per record."""

    def map_batch(self, batch: RecordBatch, h: BatchHeader, start: int, offsets: OffsetMap) -> int:
        check_base_offset(h)
        section, spans = scan_records(batch)
        keyed = [s for s in spans if s[3] >= 0 and h.base_offset + s[0] >= start]
        if keyed and offsets.entries + len(keyed) > offsets.max_entries:
            return -len(keyed) - 1
        for s in keyed:
            offsets.put(section[s[2]:s[2] + s[3]], h.base_offset + s[0])
        return len(keyed)

    def retain(self, batch: RecordBatch, h: BatchHeader, offsets: OffsetMap, now_ms: int) -> _PyRetained:
        check_base_offset(h)
        section, spans = scan_records(batch)
        has_horizon = bool(h.attributes & DELETE_HORIZON_BIT)
        latest = offsets.latest_offset
        kept = []
        for s in spans:
            offset = h.base_offset + s[0]
            mapped = offsets.get(section[s[2]:s[2] + s[3]]) if latest >= offset and s[3] >= 0 else -1
            if retain_record(offset, latest, s[3], mapped, s[4], has_horizon, now_ms, h.base_timestamp):
                kept.append(s)
        return _PyRetained(section, kept, len(spans))

    def rebuild(self, h: BatchHeader, retained: Any, delete_horizon_ms: int) -> bytes:
        return rebuild_batch(h, retained.section, retained.spans, delete_horizon_ms=delete_horizon_ms)


PYTHON: RecordKernel = PythonKernel()
