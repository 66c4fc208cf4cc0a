"""ListOffsets by timestamp in the tier: the first record at or after a time, read a step at a time.

Kafka's rule (`RemoteLogManager.findOffsetByTimestamp`, as `UnifiedLog` does for its local log): the segment's time
index gives an offset to scan from (the last entry whose timestamp is below the one asked); the answer is the first
record from there, in offset order, whose timestamp is at or after it. The scan takes whole batches `step` bytes
(1 MiB) at a time and stops at the answer, so a look-up holds one step of the segment, never the rest of it (a GiB
at Kafka's default segment size); from storage it reads the chunks it walks and the reader's usual read-ahead
(which the consumer that seeks there next reads from)."""

from __future__ import annotations

from protocol.primitives import FileRegion, RecordPieces
from protocol.records import iter_batches
from tierproxy.remote.reader import RemoteReader
from tierproxy.tier.indexes import record_at_or_after
from tierproxy.tier.model import RemoteLogSegmentMetadata


async def first_record_at_or_after(reader: RemoteReader, md: RemoteLogSegmentMetadata, start: int, ts: int,
                                   log_start: int, deadline: float, step: int = 1 << 20) -> tuple[int, int] | None:
    """(offset, timestamp) of the first record of `md` from offset `start` whose timestamp is ≥ `ts` and whose
    offset is ≥ `log_start` (control records skipped); None when the segment has none."""
    offset = start
    while offset <= md.end_offset:  # each turn goes past at least one batch (min_one): bounded by the segment
        got = (await reader.read(md, offset, step, True, False, deadline)).records
        assert not isinstance(got, FileRegion | RecordPieces)  # asked neither as a file nor in pieces
        found = record_at_or_after(got, ts, log_start)
        if found is not None:
            return found
        batches = list(iter_batches(got))
        if not batches:  # nothing more in the segment
            return None
        offset = batches[-1].last_offset + 1
    return None
