"""The bounded remote reader pool: `remote.log.reader.threads` reads at once, `remote.log.reader.max.pending.tasks`
waiting; beyond that a read is rejected at once — never an unbounded queue."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


class PoolFull(Exception):
    """The reader pool and its queue are full."""


class ReaderPool:
    def __init__(self, threads: int, max_pending: int) -> None:
        self.threads = threads
        self.max_pending = max_pending
        self._sem = asyncio.Semaphore(threads)
        self.running = 0
        self.queued = 0
        self.rejected = 0
        self.busy_seconds = 0.0
        self._loop = asyncio.get_running_loop()
        self._started = self._loop.time()

    def free(self) -> int:
        """How many more reads `submit` takes now."""
        return max(0, self.threads + self.max_pending - self.running - self.queued)

    def submit(self, make: Callable[[], Awaitable[T]]) -> asyncio.Task[T]:
        """Schedule a read; raise `PoolFull` if `threads` run and `max_pending` already wait."""
        if self.running + self.queued >= self.threads + self.max_pending:
            self.rejected += 1
            raise PoolFull(f"remote reader pool full ({self.threads} running, {self.queued} queued)")
        self.queued += 1
        return self._loop.create_task(self._run(make))

    async def _run(self, make: Callable[[], Awaitable[T]]) -> T:
        try:
            await self._sem.acquire()
        finally:
            self.queued -= 1
        self.running += 1
        start = self._loop.time()
        try:
            return await make()
        finally:
            self.running -= 1
            self.busy_seconds += self._loop.time() - start
            self._sem.release()

    def idle_percent(self) -> float:
        """Share of reader capacity idle since start (RemoteLogReaderAvgIdlePercent)."""
        elapsed = max(1e-9, (self._loop.time() - self._started) * self.threads)
        return max(0.0, 100.0 * (1 - self.busy_seconds / elapsed))
