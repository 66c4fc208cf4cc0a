"""A look-up by time over a segment's log read a step at a time.

`indexes.record_at_or_after` is the rule (the first record at or after a time, in offset order, from the time
index's floor); this applies it to a stored segment's log `step` bytes (1 MiB) at a time, whole batches each
step (a batch longer than a step is read whole), and stops at the answer: a look-up holds one step, never the
rest of the segment (a GiB at Kafka's default segment size). The Spark planner's `startingTimestamp` uses it;
the proxy walks its chunk-cached reader the same way by offset (`remote.timestamps`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from protocol.records import LENGTH_OVERHEAD, LOG_ENTRY_PREFIX, whole_batches_size
from tierproxy.tier.indexes import record_at_or_after

ReadLog = Callable[[int, int], Awaitable[bytes]]  # bytes [start, end) of the segment's log


async def scan_log_for_time(read: ReadLog, pos: int, size: int, ts: int, min_offset: int = 0,
                            step: int = 1 << 20) -> tuple[int, int] | None:
    """(offset, timestamp) of the first record at or after `ts` (offset ≥ `min_offset`, control records skipped)
    in the log's bytes [pos, size); None when it holds none (or ends inside a batch)."""
    want = step
    while pos < size:
        end = min(size, pos + want)
        data = await read(pos, end)
        whole = whole_batches_size(data)
        if not whole:  # the first batch is longer than the step: read it whole, once
            if len(data) < LOG_ENTRY_PREFIX.size:
                return None
            batch = LOG_ENTRY_PREFIX.unpack_from(data, 0)[1] + LENGTH_OVERHEAD
            if batch <= len(data) or end == size:  # storage gave less than asked, or the log ends inside it
                return None
            want = batch
            continue
        found = record_at_or_after(memoryview(data)[:whole], ts, min_offset)
        if found is not None:
            return found
        pos, want = pos + whole, step
    return None
