"""A partition's served replacements (`tier.replacement`: finished segments of a generation above 0), by start
offset, for `tier.cache`: the ones overlapping a range are found by bisection, not by a walk over all of them (a
partition's cleaned history is thousands of them, and each segment a view applies is checked against them)."""

from __future__ import annotations

import bisect

from tierproxy.tier.model import RemoteLogSegmentMetadata


class Winners:
    """Served replacements by id and by (start offset, id)."""

    __slots__ = ("by_id", "span", "starts")

    def __init__(self) -> None:
        self.by_id: dict[bytes, RemoteLogSegmentMetadata] = {}
        self.starts: list[tuple[int, bytes]] = []
        self.span = 0  # the most offsets one of them has covered: nothing starting further back reaches a range

    def __len__(self) -> int:
        return len(self.by_id)

    def add(self, md: RemoteLogSegmentMetadata) -> None:
        seg_id = md.segment_id.id
        self.pop(seg_id)
        self.by_id[seg_id] = md
        bisect.insort(self.starts, (md.start_offset, seg_id))
        self.span = max(self.span, md.end_offset - md.start_offset + 1)

    def pop(self, seg_id: bytes) -> RemoteLogSegmentMetadata | None:
        md = self.by_id.pop(seg_id, None)
        if md is not None:
            del self.starts[bisect.bisect_left(self.starts, (md.start_offset, seg_id))]
        return md

    def over(self, start: int, end: int) -> list[RemoteLogSegmentMetadata]:
        """Those holding any offset of [start, end]."""
        out = []
        i = bisect.bisect_right(self.starts, (end, b"\xff" * 17))
        while i > 0:
            i -= 1
            first, seg_id = self.starts[i]
            if first < start - self.span:
                break
            md = self.by_id[seg_id]
            if md.end_offset >= start:
                out.append(md)
        return out
