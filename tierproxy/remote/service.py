"""The proxy's remote tier as a service: metadata (RLMM) kept current, storage, the reader and its pool, and the
brokers' current offsets (high watermark, last stable offset, log start) for remote answers.

What the intercepts use of it is `remote.view.RemoteTierView` (what the tier holds, reads through the bounded
pool, the leaders' offsets, the quota, purges). It knows nothing of client sessions, rewrites or metrics: the
intercepts in `tierproxy.proxy.intercept` turn requests into these calls and the results into Kafka answers."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Iterable, Mapping
from typing import Any

from protocol.constants import ApiKey, ErrorCode, IsolationLevel
from protocol.records import build_empty_batch
from protocol.requests import PARTITION_BOUNDS, fetch_request, list_offsets_request, listed_offsets
from tierproxy.config import ProxySettings
from tierproxy.config.identity.sasl import AuthenticationFailed
from tierproxy.kafka.asyncclient import AsyncWireClient
from tierproxy.remote.leaders import OwnLeaders
from tierproxy.remote.pool import ReaderPool
from tierproxy.remote.quota import RemoteFetchQuota
from tierproxy.remote.reader import Backoff, BrokerLogUnavailable, ReadResult, RemoteReader
from tierproxy.remote.timestamps import first_record_at_or_after
from tierproxy.remote.view import BrokerOffsets
from tierproxy.tier.cache import PartitionCache
from tierproxy.tier.indexes import AbortedTxn, lookup_time
from tierproxy.tier.model import RemoteLogStartOffset, TopicIdPartition
from tierproxy.tier.open import open_metadata
from tierproxy.tier.ownership import WrongCluster, check_cluster
from tierproxy.tier.purges import forget_purge, newer_purges, record_purge, recorded_purges
from tierproxy.tier.rlmm import MetadataWriteRefused, RemoteLogMetadataManager, now_ms
from tierproxy.tier.rlmm_file import FileRLMM
from tierproxy.tier.rsm import IndexType, RemoteStorageManager
from tierproxy.tier.rules import served_segments
from tierproxy.tier.storage import FileStore

log = logging.getLogger("tierproxy.remote")


class RemoteTier:
    def __init__(self, settings: ProxySettings) -> None:
        self.settings = settings
        self.rlmm: RemoteLogMetadataManager = open_metadata(settings.metadata, settings.own_bootstrap,
                                                            settings.metadata_checkpoint_dir, settings.identity)
        # a partition's segment records applied when it is first read: a start reads a million (`tier.cache`)
        self.rlmm.deferring = True
        self.rsm = RemoteStorageManager.from_uri(settings.storage)
        self.reader = RemoteReader(
            self.rsm, chunk_bytes=settings.remote_fetch_chunk_bytes, cache_bytes=settings.remote_fetch_cache_bytes,
            prefetch_chunks=settings.remote_fetch_prefetch_chunks,
            max_prefetch_chunks=settings.remote_fetch_prefetch_max_chunks,
            index_cache_bytes=settings.remote_log_index_file_cache_total_size_bytes,
            backoff=Backoff(settings.remote_log_manager_task_retry_backoff_ms,
                            settings.remote_log_manager_task_retry_backoff_max_ms,
                            settings.remote_log_manager_task_retry_jitter),
            direct=settings.remote_fetch_file_direct_reads and isinstance(self.rsm.store, FileStore),
            send_files=settings.remote_fetch_file_sendfile)
        self.pool = ReaderPool(settings.remote_log_reader_threads, settings.remote_log_reader_max_pending_tasks)
        self._quota = RemoteFetchQuota(settings.remote_log_manager_fetch_max_bytes_per_second,
                                      settings.remote_fetch_client_max_bytes_per_second)
        self.current_ids: dict[str, bytes] = {}
        self._ids_named: dict[str, float] = {}  # topic → time.monotonic() a Metadata answer last named its id
        self.leaders = OwnLeaders(settings, on_metadata=self.learn_topic_ids)
        self.loading_problem: str | None = None  # why the metadata has not loaded yet (readyz says it)
        self.ready = asyncio.Event()
        self._offsets: dict[tuple[str, int], BrokerOffsets] = {}
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        self._tasks.append(asyncio.get_running_loop().create_task(self._run()))

    async def _run(self) -> None:
        delay = 1.0
        started = False
        while True:
            try:
                await self._check_owner()
                if not started:
                    await self.rlmm.start()
                    started = True
                await self._replay_purges()
                break
            except Exception as exc:  # the tier is optional for tail reads: keep trying in the background
                reason = await self._identity_problem() or exc
                self.loading_problem = str(reason)
                log.warning("remote log metadata not available yet (%s); retrying in %.0fs", reason, delay)
                await asyncio.sleep(delay)
                delay = min(30.0, delay * 2)
        self.ready.set()
        log.info("remote tier ready: %d partitions with tiered data", len(self.rlmm.cache.partitions))
        self._tasks.append(asyncio.get_running_loop().create_task(self._warm()))
        # what the start deferred, applied behind the answers a partition per turn of the loop: a wide fetch or the
        # first scrape then finds it done, not a million segments' records to apply in its own time
        self._tasks.append(asyncio.get_running_loop().create_task(self.rlmm.cache.index_gradually()))
        if isinstance(self.rlmm, FileRLMM):
            while True:  # the file backend has no consumer: pick up what `tier` appended
                await asyncio.sleep(1.0)
                await self.rlmm.catch_up()

    async def _replay_purges(self) -> None:
        """The tier's purge records above what the metadata says (`tier.purges`), before anything is served: a
        purge is in the tier the moment it is recorded, whatever the metadata topic holds."""
        for event in newer_purges(self.rlmm.cache, await recorded_purges(self.rsm.store, self.rsm.prefix)):
            self.rlmm.cache.apply(event)
            log.warning("%s-%d: purged below %d by a purge record the metadata does not hold", event.tp.topic,
                        event.tp.partition, event.log_start_offset)

    async def _warm(self) -> None:
        """What a remote answer asks of the cluster, made ready before the first one: the tiered topics' current
        ids and leaders (one Metadata) and a connection of tierproxy's own to each leader (one ListOffsets per
        bound of the tiered partitions it leads). A cold catch-up's first fetch otherwise opened both connections
        in its own time (7-10 ms); the log starts tell a new connection's first fetch which partitions are history
        (`intercept.fetch.handler.expected_remote`). Best effort: what fails here is asked again when needed."""
        topics = {pc.tp.topic for pc in list(self.rlmm.cache.partitions.values())}
        if not topics:
            return
        try:
            await asyncio.wait_for(self.leaders.refresh(topics, max_age=0), 10)
            led = {(pc.tp.topic, pc.tp.partition) for pc in list(self.rlmm.cache.partitions.values())
                   if self.leaders.known(pc.tp.topic, pc.tp.partition) is not None}
            got = await asyncio.wait_for(self.broker_offsets_many(sorted(led)), 10)
            log.info("own connections ready: %d topics' ids and leaders asked, the log starts of %d partitions",
                     len(topics), len(got))
        except (OSError, TimeoutError, ConnectionError, KeyError) as exc:
            log.info("own connections not made ahead (%s): the first remote fetch makes them", exc)

    async def _check_owner(self) -> None:
        """Never the history of another cluster's tier (a mistyped bootstrap): WrongCluster keeps the tier not
        ready. Brokers or storage that cannot be asked now do not hold the tier back (`serve` checked at start
        where it could; the tier answers only what the brokers first answered)."""
        try:
            cluster = await self.leaders.cluster_id()
            await check_cluster(self.rsm, cluster, record=False, brokers=self.settings.own_bootstrap)
        except WrongCluster:
            raise
        except Exception as exc:
            log.info("which cluster the tier belongs to was not checked: %s: %s", type(exc).__name__, exc)

    async def _identity_problem(self) -> AuthenticationFailed | None:
        """Why tierproxy's own identity is refused, if it is (aiokafka only says it could not bootstrap)."""
        identity = self.settings.identity
        if identity is None or not identity.sasl:
            return None
        host, port = self.settings.own_bootstrap_list[0]
        client = AsyncWireClient(host, port, identity=identity, timeout=5)
        try:
            await client.request(ApiKey.METADATA, 12, {"topics": [], "allow_auto_topic_creation": False})
        except AuthenticationFailed as exc:
            return exc
        except (OSError, TimeoutError, ConnectionError):
            return None
        finally:
            await client.close()
        return None

    async def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.ready.is_set():
            await self.rlmm.close()
        await self.leaders.close()
        await self.reader.close()
        await self.rsm.close()

    @property
    def quota(self) -> RemoteFetchQuota:
        return self._quota

    async def put_log_start(self, tp: TopicIdPartition, log_start: int) -> None:
        """Record a purge below `log_start` (RemoteLogStartOffset): first a purge record in the tier itself
        (`tier.purges`: it outlives the cluster and its metadata topic), then the metadata."""
        pc = self.rlmm.partition(tp)
        if pc is not None and log_start <= pc.log_start_offset:
            return  # nothing moves
        await record_purge(self.rsm.store, self.rsm.prefix, RemoteLogStartOffset(tp, log_start, now_ms()))
        try:
            await self.rlmm.put_log_start(tp, log_start)
        except MetadataWriteRefused:  # nothing was written: answered as not recorded, no later reader applies it
            await forget_purge(self.rsm.store, self.rsm.prefix, tp, log_start)
            raise
        # any other failure (a timeout, a cancelled wait) may have been applied, as a DeleteRecords that timed out
        # may have been in Kafka: the record stays (removed, the purge would live in the metadata alone, and be lost
        # with the cluster); the client asked for it, and its retry records the same

    @property
    def serving(self) -> bool:
        """The segment metadata is loaded and moving: answers about what the tier holds can be trusted. While it
        is not, an offset the broker no longer has may still be tiered, so it must not be answered as gone."""
        return self.ready.is_set() and self.rlmm.failure is None

    def learn_topic_ids(self, topics: Iterable[Mapping[str, Any]]) -> None:
        """Topic name → current id, from Metadata answers (the clients' as they pass, and tierproxy's own). Either
        is the cluster naming the topic's id at that moment: a client's answer counts as fresh as one we asked."""
        now = time.monotonic()
        for t in topics:
            tid = t.get("topic_id")
            if t.get("error_code", 0) == 0 and t.get("name") and tid and any(tid):
                self._ids_named[t["name"]] = now
                if (old := self.current_ids.get(t["name"])) is not None and old != bytes(tid):
                    log.info("topic %s has a new id %s (was %s): the old id's history is not served",
                             t["name"], bytes(tid).hex(), old.hex())
                self.current_ids[t["name"]] = bytes(tid)

    async def refresh_topic_ids(self, topics: set[str], max_age: float = 1.0) -> set[str]:
        """Make sure the current ids of `topics` are at most `max_age` seconds old (asked on tierproxy's own
        listener): checked before the tier answers a fetch by name. Returns the topics whose current id is known
        that fresh (a topic the cluster did not name without error is not among them). Topics a Metadata answer
        passing through named that recently are not asked again: a client's Metadata just before its first Fetch
        (what every client does) makes that fetch's own lookup unnecessary."""
        named = self._named_within(topics, max_age)
        if named == topics:
            return named
        return named | await self.leaders.refresh(topics - named, max_age)

    def fresh_topic_ids(self, topics: set[str], max_age: float = 1.0) -> set[str]:
        """The topics whose current id is known at most `max_age` seconds old, asking nothing: what
        `refresh_topic_ids` would return without a request."""
        named = self._named_within(topics, max_age)
        return named | self.leaders.fresh(topics - named, max_age)

    def _named_within(self, topics: set[str], max_age: float) -> set[str]:
        """The topics a Metadata answer passing through named within `max_age` seconds."""
        now = time.monotonic()
        return {t for t in topics if now - self._ids_named.get(t, -math.inf) <= max_age}

    def partition(self, topic: str, partition: int) -> PartitionCache | None:
        """The tiered history of `topic` by name, only under the topic's current id: a topic deleted and created
        again under the same name never gets the old topic's history (O item 9). Until an id is known for the
        name (no Metadata v10+ seen yet), the newest tiered id for it."""
        if not self.ready.is_set():
            return None
        pc = self.rlmm.cache.find(topic, partition)
        current = self.current_ids.get(topic)
        if pc is not None and current is not None and pc.tp.topic_id != current:
            return self.partition_by_id(current, partition)
        return pc

    def partition_by_id(self, topic_id: bytes, partition: int) -> PartitionCache | None:
        if not self.ready.is_set():
            return None
        pc = self.rlmm.cache.get(topic_id, partition)
        return None if pc is None or self.rlmm.cache.is_deleted(topic_id, partition) else pc

    def read_slots(self) -> int:
        return self.pool.free()

    def submit_read(self, pc: PartitionCache, offset: int, max_bytes: int, read_committed: bool,
                    deadline: float, min_one: bool = True, as_file: bool = False) -> asyncio.Task[ReadResult] | None:
        """Whole batches from `offset` (at least one if `min_one`), up to `max_bytes`, read through the bounded
        pool by `deadline` (loop time); None when no tiered segment holds `offset`. Raises PoolFull when the pool
        is. An offset inside a hole between served segments is not the tier's to answer (the broker may hold it, or
        it is a gap: `intercept.fetch` decides)."""
        md = pc.segment_for_offset(offset)
        if md is None:
            return None
        # a transaction open at this segment's end is looked for in the later segments
        following = [m for m in pc.finished() if m.start_offset > md.end_offset]

        async def read() -> ReadResult:
            seg, at, rest = md, offset, following
            while True:
                res = await self.reader.read(seg, at, max_bytes, min_one, read_committed, deadline, rest,
                                             as_file, joined=False,  # the answer's encoder sends the pieces as they are
                                             recorded=pc.outcomes)  # final: only an undecided one is left unresolved
                if not res.past_end:
                    break
                # the cleaner removed the rest of a compacted segment: the next batch is in the next segment (as
                # Kafka's RemoteLogManager.read goes on); past the tier's end or before a hole, a batch of no records
                # up to this segment's end moves the client on to what holds the next offset
                if not rest or rest[0].start_offset != seg.end_offset + 1:
                    return ReadResult(memoryview(build_empty_batch(offset, seg.end_offset)))
                seg, rest = rest[0], rest[1:]
                at = seg.start_offset
            if res.unresolved:
                res.aborted += await self.aborted_in_broker_log(pc.tp.topic, pc.tp.partition, set(res.unresolved))
            return res

        return self.pool.submit(read)

    async def aborted_in_broker_log(self, topic: str, partition: int, producers: set[int]) -> list[AbortedTxn]:
        """Transactions of `producers` open at the tier's end whose ABORT marker is in the broker's log (as
        `RemoteLogManager.collectAbortedTransactions` goes on into the local log): a READ_COMMITTED Fetch at the
        broker's log start lists every aborted transaction that reaches it. Raises BrokerLogUnavailable when the
        leader cannot be asked: records of an undecided transaction are never served as committed."""
        try:
            offsets = await self.broker_offsets(topic, partition)
            part = await self.fetch_from_leader(topic, partition, offsets.log_start, 1, IsolationLevel.READ_COMMITTED)
        except KeyError as exc:
            raise BrokerLogUnavailable(f"{topic}-{partition}: aborted transactions in the broker's log: {exc}") \
                from None
        if part["error_code"] != ErrorCode.NONE:
            raise BrokerLogUnavailable(f"{topic}-{partition}: aborted transactions in the broker's log: error "
                                       f"{part['error_code']}")
        return [AbortedTxn(a["producer_id"], a["first_offset"], -1, -1) for a in part["aborted_transactions"] or ()
                if a["producer_id"] in producers]

    async def offset_for_timestamp(self, pc: PartitionCache, ts: int, deadline: float | None = None
                                   ) -> tuple[int, int] | None:
        """(offset, timestamp) of the first tiered record whose timestamp is ≥ `ts`: the time index gives the
        batch to start from, the records themselves the answer. Storage is retried until `deadline` (loop
        time; default: remote.list.offsets.request.timeout.ms from now)."""
        if deadline is None:
            deadline = asyncio.get_running_loop().time() + self.settings.remote_list_offsets_request_timeout_ms / 1000
        for md in served_segments(pc.finished(), pc.log_start_offset):  # nothing below a purge
            if md.max_timestamp_ms < ts:
                continue
            index = await self.reader.index(md, IndexType.TIMESTAMP, deadline)
            found = await first_record_at_or_after(self.reader, md, lookup_time(index, md.start_offset, ts), ts,
                                                   pc.log_start_offset, deadline)
            if found is not None:
                return found
        return None

    async def broker_offsets_many(self, pairs: list[tuple[str, int]], max_age: float = 1.0
                                  ) -> dict[tuple[str, int], BrokerOffsets]:
        """`broker_offsets` of many partitions: one ListOffsets per leader and bound (three per leader), not three
        per partition, every leader asked at once; partitions that cannot be asked are left out. The three bounds go
        on three connections of ours: a broker answers one connection's requests one at a time, so on one they
        took three of its turns, one after another (most of a cold catch-up's first answer)."""
        now = time.monotonic()
        out = {k: c for k in pairs if (c := self._offsets.get(k)) is not None and now - c.at < max_age}
        by_leader: dict[str, list[tuple[str, int]]] = {}
        for key in pairs:
            if key not in out:
                try:
                    by_leader.setdefault(await self.leaders.leader(*key), []).append(key)
                except (KeyError, OSError, TimeoutError, ConnectionError):
                    continue
        async def ask(leader: str, keys: list[tuple[str, int]]) -> None:
            asks = []
            for _, isolation, spec in PARTITION_BOUNDS:
                asked: dict[str, dict[int, int]] = {}
                for topic, partition in keys:
                    asked.setdefault(topic, {})[partition] = spec
                asks.append(list_offsets_request(asked, isolation=isolation))
            try:
                answers = await asyncio.gather(*(self.leaders.client(leader, lane).request(ApiKey.LIST_OFFSETS, 7, a)
                                                 for lane, a in enumerate(asks)))
                got = {name: listed_offsets(resp) for (name, _, _), resp in zip(PARTITION_BOUNDS, answers, strict=True)}
            except (OSError, TimeoutError, ConnectionError):
                await self.leaders.forget(leader)
                return
            at = time.monotonic()
            for key in keys:
                offsets = BrokerOffsets(**{name: g.get(key, -1) for name, g in got.items()}, at=at)
                if offsets.log_start < 0:
                    await self.leaders.forget(leader)
                    continue
                out[key] = self._offsets[key] = offsets

        await asyncio.gather(*(ask(leader, keys) for leader, keys in by_leader.items()))
        return out

    async def fetch_from_leader(self, topic: str, partition: int, offset: int, max_bytes: int,
                                isolation: int) -> dict[str, Any]:
        """The leader's Fetch answer for one partition at `offset`, asked with tierproxy's own identity — only for
        a client whose own request the broker has just authorized (it answered OFFSET_OUT_OF_RANGE, which Kafka
        answers only after authorizing). KeyError when the leader cannot be found or asked."""
        try:
            leader = await self.leaders.leader(topic, partition)
            resp = await self.leaders.client(leader).request(ApiKey.FETCH, 12, fetch_request(
                {topic: {partition: offset}}, max_bytes=max_bytes, isolation=isolation))
        except (OSError, TimeoutError, ConnectionError) as exc:
            raise KeyError(f"{topic}-{partition}: leader not reachable: {exc}") from exc
        part = dict(resp["responses"][0]["partitions"][0])
        part["records"] = memoryview(bytes(part["records"] or b""))  # owned: the client's buffer is reused
        return part

    def last_broker_offsets(self, topic: str, partition: int, max_age: float) -> BrokerOffsets | None:
        """The partition's offsets as its leader last answered them, if no older than `max_age` seconds."""
        c = self._offsets.get((topic, partition))
        return c if c is not None and time.monotonic() - c.at < max_age else None

    async def broker_offsets(self, topic: str, partition: int, max_age: float = 1.0) -> BrokerOffsets:
        """The partition's current HW, LSO and log start, asked of its leader with tierproxy's own identity;
        KeyError when its leader cannot be found or asked."""
        return (await self.broker_offsets_many([(topic, partition)], max_age))[(topic, partition)]
