"""The bounded reader pool rejects at once when full; backoff grows exponentially within its jitter."""

from __future__ import annotations

import asyncio

import pytest

from tierproxy.remote.pool import PoolFull, ReaderPool
from tierproxy.remote.reader import Backoff


def test_pool_runs_threads_queues_pending_and_rejects_the_rest() -> None:
    async def run() -> None:
        pool = ReaderPool(threads=2, max_pending=1)
        gate = asyncio.Event()
        started: list[int] = []

        async def read(i: int) -> int:
            started.append(i)
            await gate.wait()
            return i

        assert pool.free() == 3
        tasks = [pool.submit(lambda i=i: read(i)) for i in range(3)]
        assert pool.free() == 0  # what a fetch may still start: nothing
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert (pool.running, pool.queued) == (2, 1) and sorted(started) == [0, 1]
        with pytest.raises(PoolFull):
            pool.submit(lambda: read(99))
        assert pool.rejected == 1
        gate.set()
        assert await asyncio.gather(*tasks) == [0, 1, 2]
        assert (pool.running, pool.queued, pool.free()) == (0, 0, 3)
        pool.submit(lambda: read(3))  # room again
        await asyncio.sleep(0)

    asyncio.run(run())


def test_cancelled_waiting_read_frees_its_slot() -> None:
    async def run() -> None:
        pool = ReaderPool(threads=1, max_pending=1)
        gate = asyncio.Event()
        first = pool.submit(lambda: gate.wait())
        waiting = pool.submit(lambda: gate.wait())
        await asyncio.sleep(0)
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        assert pool.queued == 0
        gate.set()
        await first

    asyncio.run(run())


def test_backoff_is_exponential_capped_and_jittered() -> None:
    b = Backoff(initial_ms=500, max_ms=30_000, jitter=0.2)
    for attempt, base in ((0, 0.5), (1, 1.0), (3, 4.0), (10, 30.0)):
        for _ in range(50):
            assert base * 0.8 <= b.delay(attempt) <= base * 1.2
