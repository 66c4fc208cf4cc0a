"""A partition's segments kept compact: `SegmentTable` holds each segment as the metadata record it came in (the
same bytes object the view keeps as its live record, so no second copy) and makes the segment when asked;
`Materialized` bounds how many made segments the served lists of all partitions hold at once.

A view of a million segments held each as a model object (~480 B with its ints, id and epochs); as its record it
costs the table's entry alone. Made segments are kept only for the partitions being read (a fetch asks for the
served list several times), the least recently read ones dropped past the budget.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator, MutableMapping
from typing import Any

from tierproxy.tier.model import RemoteLogSegmentMetadata
from tierproxy.tier.segment_record import peek_segment_record
from tierproxy.tier.serde import decode_value

Stored = bytes | RemoteLogSegmentMetadata


class SegmentTable(MutableMapping[bytes, RemoteLogSegmentMetadata]):
    """segment id → its metadata, stored as its record (`put_record`) or as given."""

    __slots__ = ("_last", "_stored")

    def __init__(self) -> None:
        self._stored: dict[bytes, Stored] = {}
        # the last segment made, by the very object it was made from: a fetch asks its partition's segment several
        # times (does the tier hold the offset, how much may one read take, the read itself), fetch after fetch
        self._last: tuple[Stored, RemoteLogSegmentMetadata] | None = None

    def put_record(self, seg_id: bytes, value: bytes) -> None:
        """Keep the segment as `value`, a record already read whole into the segment it describes."""
        self._stored[seg_id] = value

    def rests_on(self, seg_id: bytes, record: bytes) -> bool:
        """Whether the segment is kept as `record` (or as made from an update event, whose record is not known)."""
        stored = self._stored.get(seg_id)
        return stored is not None and (not isinstance(stored, bytes) or stored is record or stored == record)

    def __getitem__(self, seg_id: bytes) -> RemoteLogSegmentMetadata:
        stored = self._stored[seg_id]
        last = self._last
        if last is not None and last[0] is stored:
            return last[1]
        md = _made(stored)
        self._last = (stored, md)
        return md

    def __setitem__(self, seg_id: bytes, md: RemoteLogSegmentMetadata) -> None:
        self._stored[seg_id] = md

    def __delitem__(self, seg_id: bytes) -> None:
        del self._stored[seg_id]

    def __contains__(self, seg_id: object) -> bool:
        return seg_id in self._stored

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._stored)

    def __len__(self) -> int:
        return len(self._stored)

    def facts(self, seg_id: bytes) -> tuple[int, int, int, int]:
        """(start, end, event timestamp, size) without making the segment where its record allows."""
        stored = self._stored[seg_id]
        peeked = peek_segment_record(stored) if isinstance(stored, bytes) else None
        if peeked is not None:
            return peeked
        md = _made(stored)
        return md.start_offset, md.end_offset, md.event_timestamp_ms, md.segment_size_in_bytes


def _made(stored: Stored) -> RemoteLogSegmentMetadata:
    if isinstance(stored, RemoteLogSegmentMetadata):
        return stored
    md = decode_value(stored)
    assert isinstance(md, RemoteLogSegmentMetadata)  # only segment records are put
    return md


class Materialized:
    """The partitions whose served segments are made, least recently read first, within `budget` segments in all
    (the partition read last is kept whatever its size)."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.held = 0
        self._order: OrderedDict[Any, int] = OrderedDict()  # partition cache → segments it holds made
        self._lock = threading.Lock()  # the tier job's threads read the view the loop applies to

    def touch(self, owner: Any, count: int | None = None) -> None:
        """`owner` was read (with `count`: it has just made that many)."""
        with self._lock:
            if count is not None:
                self.held += count - self._order.pop(owner, 0)
                self._order[owner] = count
            elif owner in self._order:
                self._order.move_to_end(owner)
            while self.held > self.budget and len(self._order) > 1:
                oldest, n = self._order.popitem(last=False)
                self.held -= n
                oldest.forget_made()

    def drop(self, owner: Any) -> None:
        """`owner` changed: what it made is stale (it drops it itself)."""
        with self._lock:
            self.held -= self._order.pop(owner, 0)


MATERIALIZED = Materialized(200_000)  # ~100 MB of made segments at most, whatever the tier's size
