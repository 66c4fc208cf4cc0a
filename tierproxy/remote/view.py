"""What the proxy's intercepts may use of the remote tier: `RemoteTierView`. The service (`remote.service.RemoteTier`)
implements it over real storage and metadata; `tests/core` implements it in memory, so the remote fetch path runs
in-process. Named here, in the remote layer, so the proxy depends on this interface and not on how it is served."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from tierproxy.remote.quota import RemoteFetchQuota
from tierproxy.remote.reader import ReadResult
from tierproxy.tier.cache import PartitionCache
from tierproxy.tier.model import TopicIdPartition


@dataclass
class BrokerOffsets:
    """A partition's offsets as its leader answered them (ListOffsets with tierproxy's own identity)."""

    high_watermark: int
    last_stable: int
    log_start: int
    at: float  # time.monotonic() of the answer


class RemoteTierView(Protocol):
    """The remote tier as the intercepts see it: what it holds, reads through the bounded pool, the leaders'
    offsets, the remote fetch quota, and the one write a client can cause (a purge by DeleteRecords)."""

    @property
    def serving(self) -> bool:
        """The segment metadata is loaded and moving: answers about what the tier holds can be trusted."""

    @property
    def quota(self) -> RemoteFetchQuota: ...

    def partition(self, topic: str, partition: int) -> PartitionCache | None: ...

    def partition_by_id(self, topic_id: bytes, partition: int) -> PartitionCache | None: ...

    def learn_topic_ids(self, topics: Iterable[Mapping[str, Any]]) -> None: ...

    async def refresh_topic_ids(self, topics: set[str], max_age: float = 1.0) -> set[str]:
        """The current ids of `topics` at most `max_age` old; returns the topics whose id is known that fresh."""

    def fresh_topic_ids(self, topics: set[str], max_age: float = 1.0) -> set[str]:
        """What `refresh_topic_ids` would return without asking anything."""

    def submit_read(self, pc: PartitionCache, offset: int, max_bytes: int, read_committed: bool,
                    deadline: float, min_one: bool = True, as_file: bool = False) -> asyncio.Task[ReadResult] | None:
        """Whole batches from `offset`; None when no served segment holds it; raises PoolFull. The records may
        come as `RecordPieces` (views of the cached chunks they straddle) and, with `as_file`, as a `FileRegion`
        (the caller's transport sends it)."""

    def read_slots(self) -> int:
        """How many more reads the bounded pool takes now (running and queued below their bounds)."""

    async def offset_for_timestamp(self, pc: PartitionCache, ts: int, deadline: float | None = None
                                   ) -> tuple[int, int] | None: ...

    async def broker_offsets(self, topic: str, partition: int, max_age: float = 1.0) -> BrokerOffsets: ...

    async def broker_offsets_many(self, pairs: list[tuple[str, int]], max_age: float = 1.0
                                  ) -> dict[tuple[str, int], BrokerOffsets]: ...

    def last_broker_offsets(self, topic: str, partition: int, max_age: float) -> BrokerOffsets | None: ...

    async def put_log_start(self, tp: TopicIdPartition, log_start: int) -> None:
        """Record a purge below `log_start` in the metadata (every replica's view); raises when it cannot."""
