"""What an executor of the DataFrame reader (and of the Iceberg step) is given: `Slice`s, packed into input partitions.

Apart from the planner (`plan`) so that an executor's Python worker imports only this, not the cluster client the
planner needs: Spark forks a worker per task slot (again after a minute idle), and each imports what the pickled
task names.
"""

from __future__ import annotations

from dataclasses import dataclass

from tierproxy.tier.model import RemoteLogSegmentMetadata

READ_BYTES = 32 << 20  # the most bytes one ranged read of a segment fetches into a worker's memory
OPEN_COST = 4 << 20  # spark.sql.files.openCostInBytes: what one more read costs, in bytes, when packing


@dataclass(frozen=True)
class Slice:
    """One Spark input partition: records with start ≤ offset < end of one topic partition."""

    topic: str
    partition: int
    start: int
    end: int
    segment: RemoteLogSegmentMetadata | None = None  # a tier read; None: a live read from `leader`
    byte_range: tuple[int, int] | None = None  # part of a large segment; None: found from the offset index
    leader: str = ""
    aborted: tuple[tuple[int, int], ...] = ()  # (producer id, first offset), for read_committed

    @property
    def size(self) -> int:
        """Bytes the slice reads at most (a live range: unknown, 0)."""
        if self.byte_range is not None:
            return self.byte_range[1] - self.byte_range[0]
        return self.segment.segment_size_in_bytes if self.segment is not None else 0


def pack(slices: list[Slice], max_bytes: int, min_partitions: int | None) -> list[tuple[Slice, ...]]:
    """Slices → input partitions, next fit in plan order (a partition's slices stay in offset order)."""
    target = max_bytes
    if min_partitions:
        total = sum(s.size + OPEN_COST for s in slices if s.segment is not None)
        target = min(max_bytes, max(OPEN_COST, total // min_partitions))
    out: list[tuple[Slice, ...]] = []
    group: list[Slice] = []
    used = 0
    for s in slices:
        if s.segment is None:
            out.append((s,))
            continue
        cost = s.size + OPEN_COST
        if group and used + cost > target:
            out.append(tuple(group))
            group, used = [], 0
        group.append(s)
        used += cost
    if group:
        out.append(tuple(group))
    return out
