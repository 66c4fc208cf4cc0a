"""A partition's served segments in one leader epoch, by the start offset of that epoch inside each (`tier.cache`)."""

from __future__ import annotations

import bisect


class EpochIndex:
    """start offset (of this epoch inside a segment) → segment id, sorted."""

    __slots__ = ("ids", "starts")

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.ids: dict[int, bytes] = {}

    def put(self, start: int, seg_id: bytes) -> bytes | None:
        old = self.ids.get(start)
        if old is None:
            bisect.insort(self.starts, start)
        self.ids[start] = seg_id
        return old

    def remove(self, start: int, seg_id: bytes) -> None:
        if self.ids.get(start) == seg_id:
            del self.ids[start]
            self.starts.pop(bisect.bisect_left(self.starts, start))

    def floor(self, offset: int) -> bytes | None:
        i = bisect.bisect_right(self.starts, offset)
        return self.ids[self.starts[i - 1]] if i else None
