"""ListOffsets by timestamp in the tier (`tierproxy.remote.timestamps`): the first record at or after a time, in
offset order, as a scan of every record finds it — reading a step at a time, not the rest of the segment."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

from protocol.records import Record, build_batch
from tests.support.segments import stored_segment
from tierproxy.remote.reader import RemoteReader
from tierproxy.remote.timestamps import first_record_at_or_after
from tierproxy.tier.rsm import RemoteStorageManager

CHUNK = 16 * 1024


def test_the_first_record_at_or_after_a_time_reading_one_step_at_a_time(tmp_path: Path) -> None:
    rng = random.Random(11)
    # 200 batches of 3 records, ~1 KiB each; timestamps rise with jitter, so some go back in time
    times = [1000 + 10 * i + rng.randrange(-25, 25) for i in range(600)]
    raw = b"".join(build_batch([Record(o, times[o], None, rng.randbytes(1000)) for o in range(b * 3, b * 3 + 3)],
                               base_offset=b * 3) for b in range(200))

    def oracle(ts: int, start: int, log_start: int) -> tuple[int, int] | None:
        return next(((o, t) for o, t in enumerate(times) if o >= start and o >= log_start and t >= ts), None)

    async def run() -> None:
        rsm = RemoteStorageManager.from_uri(f"file://{tmp_path}/tier")
        md = await stored_segment(rsm, raw, "times")
        deadline = asyncio.get_running_loop().time() + 30
        for ts in (0, 1000, 1333, 3000, 5555, 7000, times[-1], times[-1] + 1):
            for start, log_start in ((0, 0), (90, 0), (0, 301)):
                reader = RemoteReader(rsm, chunk_bytes=CHUNK, prefetch_chunks=0)
                found = await first_record_at_or_after(reader, md, start, ts, log_start, deadline, CHUNK)
                assert found == oracle(ts, start, log_start), (ts, start, log_start)
        # an answer near the start of a ~640 KiB segment reads a step or two of it, not the rest
        reader = RemoteReader(rsm, chunk_bytes=CHUNK, prefetch_chunks=0)
        assert await first_record_at_or_after(reader, md, 0, 1100, 0, deadline, CHUNK) == oracle(1100, 0, 0)
        assert 0 < reader.bytes_read <= 2 * CHUNK < len(raw) // 10

    asyncio.run(run())
