"""The Spark planner's look-up by time (`tier.timescan`): the first record at or after a time over a stored
segment's log, as a scan of every record finds it, reading a step at a time (a batch longer than a step read
whole), never the rest of the segment; a log cut inside a batch answers None, never a wrong offset."""

from __future__ import annotations

import asyncio
import random

from protocol.records import Record, build_batch, iter_batches
from tierproxy.tier.timescan import scan_log_for_time

STEP = 16 * 1024


def _log(rng: random.Random) -> tuple[bytes, list[int], list[int]]:
    """150 batches of 1-4 records, one of ~40 KiB (longer than a step); timestamps that sometimes go back."""
    times, starts, batches, offset = [], [], [], 0
    for b in range(150):
        n = rng.randint(1, 4)
        size = 40_000 if b == 70 else rng.randint(100, 1500)
        recs = []
        for o in range(offset, offset + n):
            times.append(1000 + 10 * o + rng.randrange(-25, 25))
            recs.append(Record(o, times[o], None, rng.randbytes(size)))
        starts.append(sum(map(len, batches)))
        batches.append(build_batch(recs, base_offset=offset))
        offset += n
    return b"".join(batches), times, starts


def test_the_first_record_at_or_after_a_time_a_step_at_a_time() -> None:
    rng = random.Random(5)
    log, times, starts = _log(rng)
    asked: list[tuple[int, int]] = []

    async def read(start: int, end: int) -> bytes:
        asked.append((start, end))
        return log[start:end]

    def oracle(ts: int, min_offset: int) -> tuple[int, int] | None:
        return next(((o, t) for o, t in enumerate(times) if o >= min_offset and t >= ts), None)

    async def run() -> None:
        for ts in (0, 1000, 1444, 2222, times[-1], times[-1] + 1, 10**12):
            for pos, min_offset in ((0, 0), (starts[40], 0), (starts[70], 0), (0, 250)):
                got = await scan_log_for_time(read, pos, len(log), ts, min_offset, STEP)
                want = oracle(ts, max(min_offset, _first_offset_at(log, pos)))
                assert got == want, (ts, pos, min_offset)
        asked.clear()
        # an answer in the first batches reads one step, not the ~300 KiB log
        assert await scan_log_for_time(read, 0, len(log), 1050, 0, STEP) == oracle(1050, 0)
        assert asked == [(0, STEP)]
        # the ~40 KiB batch is read whole once the step finds it too long
        asked.clear()
        ts70 = max(times[o] for o in range(_first_offset_at(log, starts[70]), _first_offset_at(log, starts[71])))
        assert await scan_log_for_time(read, starts[70], len(log), ts70, 0, STEP) is not None
        assert asked[0] == (starts[70], starts[70] + STEP) and asked[1][1] - asked[1][0] == starts[71] - starts[70]
        # a log cut inside its last batch: what lies before the cut is found, the cut batch never read as records
        cut = log[:len(log) - 5]

        async def read_cut(start: int, end: int) -> bytes:
            return cut[start:end]
        assert await scan_log_for_time(read_cut, 0, len(cut), 1050, 0, STEP) == oracle(1050, 0)
        assert await scan_log_for_time(read_cut, starts[-1], len(cut), 0, 0, STEP) is None

    asyncio.run(run())


def _first_offset_at(log: bytes, pos: int) -> int:
    return next(iter_batches(memoryview(log)[pos:])).base_offset
