"""The delayed remote fetch (Kafka's `DelayedRemoteFetch`): one per client Fetch whose answer needs the tier. It
owns the plan, the tier view, the stats and the purgatory's deadline; it reads every partition the broker
answered OFFSET_OUT_OF_RANGE and the tier holds, in parallel (reads started early are reused), and completes when
they finish or at the deadline (`remote.fetch.max.wait.ms`): an expired partition is answered with empty records
and no error (its read goes on warming the cache). Errors come from one table (`intercept.errors`)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

from protocol.messages import FetchResponse
from protocol.primitives import FileRegion, RecordPieces
from protocol.records import build_empty_batch
from tierproxy.proxy.flow import ByteBudget
from tierproxy.proxy.intercept.errors import LOST_OBJECT, OFFSETS_UNKNOWN, SEGMENT_GONE, error_for
from tierproxy.proxy.intercept.fetch.answer import (
    Answer,
    BrokerPart,
    Entry,
    answer_of,
    answered_bytes,
    broker_entries,
    partition_entry,
)
from tierproxy.proxy.intercept.fetch.plan import Budget, FetchPlan, Key, fit_budget
from tierproxy.proxy.metrics import RemoteFetchStats
from tierproxy.remote.pool import PoolFull
from tierproxy.remote.reader import ReadResult
from tierproxy.remote.view import BrokerOffsets, RemoteTierView
from tierproxy.tier.cache import PartitionCache
from tierproxy.tier.rules import resume_offset
from tierproxy.tier.storage import ObjectMissing

log = logging.getLogger("tierproxy.proxy.intercept.fetch")
STALE_OFFSETS_S = 30.0
UNBOUNDED = 2**31 - 1
FRESH_OFFSETS_S = 1.0  # a leader's offsets this recent are used as they are (`broker_offsets_many`'s max age)
Reads = dict[Key, asyncio.Task[ReadResult]]


@dataclass
class Settled:
    """A remote fetch's final budget and its reads, settled once the broker has answered."""

    oor: list[Key]
    budget: Budget
    reads: Reads
    errors: dict[Key, int]
    rejected: set[Key]
    throttle_ms: int


def tiered_partition(tier: RemoteTierView, key: Key) -> PartitionCache | None:
    """The tiered partition a Fetch's key names: by topic id (v13+), or by name under its current id."""
    topic = key[0]
    return tier.partition_by_id(topic, key[1]) if isinstance(topic, bytes) else tier.partition(topic, key[1])


class DelayedRemoteFetch:
    """The remote part of one client Fetch. `tiered` is the connection's map of partitions it reads from the tier
    to the broker's local log start (it learns and forgets them here)."""

    def __init__(self, tier: RemoteTierView, plan: FetchPlan, stats: RemoteFetchStats, memory: ByteBudget,
                 tiered: dict[Key, int], deadline: float) -> None:
        self.tier, self.plan, self.stats, self.memory, self.tiered = tier, plan, stats, memory, tiered
        self.deadline = deadline  # loop time

    def partition(self, key: Key) -> PartitionCache | None:
        return tiered_partition(self.tier, key)

    def tier_answers(self, key: Key) -> bool:
        """A served segment holds the fetch offset (inside a hole the broker may hold it: `past_the_tier`)."""
        pc = self.partition(key)
        return pc is not None and pc.segment_for_offset(self.plan.fetch_offset(key)) is not None

    def holds(self, key: Key) -> int:
        """The most one read of the partition at its fetch offset can return: the size of the segment holding it (a
        read stays in one segment); unbounded where the tier does not hold the offset (that read is not started)."""
        pc = self.partition(key)
        md = pc.segment_for_offset(self.plan.fetch_offset(key)) if pc is not None else None
        return md.segment_size_in_bytes if md is not None and md.segment_size_in_bytes > 0 else UNBOUNDED

    # --- memory ---------------------------------------------------------------------------------------------------
    def reserve(self, budget: Budget) -> Budget:
        """The part of a budget the process-wide bound (`queued.max.request.bytes`, shared with requests being
        received) can hold now, in request order; held by the plan until its response leaves the process.
        Partitions left out are answered empty at the deadline and read on a later fetch."""
        granted = self.memory.reserve(sum(size for size, _ in budget.values()))
        self.plan.reserved += granted
        out: Budget = {}
        for key, (size, min_one) in budget.items():
            if granted <= 0:
                break
            out[key] = (min(size, granted), min_one)
            granted -= out[key][0]
        return out

    # --- reads ----------------------------------------------------------------------------------------------------
    def start_reads(self, budget: Budget) -> tuple[Reads, dict[Key, int], set[Key]]:
        """Start each partition's read in the pool within its budget; partitions that cannot be read get their
        error at once. A full pool (overload across many clients) is not an error: the partition is answered
        empty at the deadline, and the client asks again. → (reads, errors, rejected)"""
        reads: Reads = {}
        errors: dict[Key, int] = {}
        rejected: set[Key] = set()
        for key, (max_bytes, min_one) in budget.items():
            pc = self.partition(key)
            try:
                task = (self.tier.submit_read(pc, self.plan.fetch_offset(key), max_bytes, self.plan.read_committed,
                                              self.deadline, min_one, self.plan.as_file) if pc else None)
            except PoolFull as exc:
                log.warning("%s: %s answered empty", exc, key)
                rejected.add(key)
                continue
            if task is None:  # the segment is gone (or the partition): the broker's answer stands
                errors[key] = SEGMENT_GONE
                self.tiered.pop(key, None)
                continue
            task.add_done_callback(consume_exception)
            reads[key] = task
            self.plan.read_from[key] = pc
        return reads, errors, rejected

    def start_early(self) -> None:
        """At the request: read the partitions expected remote while the broker answers."""
        plan = self.plan
        plan.budget = self.reserve(fit_budget(plan, plan.remote, 0, holds=self.holds, slots=self.tier.read_slots()))
        plan.reads, plan.errors, plan.rejected = self.start_reads(plan.budget)
        if any(k not in self.tiered for k in plan.remote):
            # new to this connection (its first fetch): what the answer will ask of the cluster, asked now too; a
            # known partition's answers are mostly cached (~1 s) and asked, when stale, after the broker's answer
            loop = asyncio.get_running_loop()
            plan.lookups = [loop.create_task(self._ask_offsets(plan.remote))]
            if not plan.by_id:
                plan.lookups.append(loop.create_task(self.tier.refresh_topic_ids({str(k[0]) for k in plan.remote})))
            for task in plan.lookups:
                task.add_done_callback(consume_exception)

    async def _early_lookups(self) -> None:
        """The lookups started at the request, finished (or the deadline): asking again meanwhile would send the
        same requests twice."""
        pending = [t for t in self.plan.lookups if not t.done()]
        if pending:
            await asyncio.wait(pending, timeout=max(0.0, self.deadline - asyncio.get_running_loop().time()))

    # --- completion -----------------------------------------------------------------------------------------------
    def complete_now(self, upstream: FetchResponse | BrokerPart, oor: list[Key], beyond: list[Key]
                     ) -> Answer | Coroutine[Any, Any, Answer]:
        """The answer at once when waiting would find everything already there — a catch-up's steady state: the
        reads started at the request are done, and the topics' current ids and the leader's offsets were asked less
        than a second ago (what `complete` would wait for, it would get without a request). The same steps as
        `complete`, without its tasks and loop turns. Otherwise the coroutine that completes it (`complete`, or its
        rest once the budget is settled here)."""
        plan, tier = self.plan, self.tier
        if beyond or any(not t.done() for t in plan.lookups):
            return self.complete(upstream, oor, beyond)
        if not plan.by_id:
            names = {str(k[0]) for k in oor}
            if tier.fresh_topic_ids(names) != names:
                return self.complete(upstream, oor, beyond)
            oor = [k for k in oor if self.tier_answers(k)]  # as `under_current_ids` would, with nothing to ask
        offsets: dict[Key, BrokerOffsets] = {}
        for key in oor:
            pc = self.partition(key)
            # records go out with the leader's offsets of the last second; an empty answer with the last known
            age = FRESH_OFFSETS_S if key in plan.reads else STALE_OFFSETS_S
            last = tier.last_broker_offsets(pc.tp.topic, key[1], age) if pc is not None else None
            if last is None or (key in plan.reads and plan.read_from.get(key) is not pc):
                return self.complete(upstream, oor, beyond)
            offsets[key] = last
        settled = self._settle(upstream, oor)
        fresh_since = time.monotonic() - FRESH_OFFSETS_S
        if (settled.rejected or any(not t.done() for t in settled.reads.values())
                or any(offsets[k].at < fresh_since for k in settled.reads)):
            # a read to wait for, one the pool or the memory bound refused (answered empty at the deadline, so the
            # client does not ask again at once), or one started late whose leader's offsets are to be asked
            return self._finish(upstream, settled, [], None)
        return self._answer(upstream, settled, offsets, {})

    async def complete(self, upstream: FetchResponse | BrokerPart, oor: list[Key], beyond: list[Key]) -> Answer:
        """The answer: the broker's entries, the tier's for `oor` (read in time, an error, or empty), and an
        answer across the gap for each of `beyond` (`across_the_gap`). Returns the response to encode."""
        # by name: the tier answers only under the topic's current id (never a deleted topic's); the ids are asked
        # while the reads and the leader's offsets go on, and a read the answer disowns is never served
        ids = None if self.plan.by_id else asyncio.get_running_loop().create_task(self.under_current_ids(oor))
        return await self._finish(upstream, self._settle(upstream, oor), beyond, ids)

    def _settle(self, upstream: FetchResponse | BrokerPart, oor: list[Key]) -> Settled:
        """The fetch's final byte budget (the remote quota's allowance, the request's max bytes less what the broker
        answered, the process-wide memory bound) and its reads: those started early where the budget allows them,
        the others now. Partitions beyond the budget have no read and no error: empty, read on a later fetch."""
        plan = self.plan
        allowed, throttle_ms = self.tier.quota.allowance(plan.client_id)
        # the early reads still running hold pool slots this budget reuses
        slots = self.tier.read_slots() + sum(1 for t in plan.reads.values() if not t.done())
        wanted = fit_budget(plan, oor, answered_bytes(upstream), allowed, holds=self.holds, slots=slots)
        self.memory.give_back(plan.reserved)  # the early reads' grant: the final budget takes its own
        plan.reserved = 0
        budget = self.reserve(wanted)
        plan.requested_reads = set(budget)
        reads, errors, rejected = self._reads_for(budget, wanted)
        return Settled(oor, budget, reads, errors, rejected, throttle_ms)

    async def _finish(self, upstream: FetchResponse | BrokerPart, s: Settled, beyond: list[Key],
                      ids: asyncio.Task[list[Key]] | None) -> Answer:
        loop = asyncio.get_running_loop()
        to_ask, known = self._to_ask(s)
        offsets_task = loop.create_task(self.broker_offsets(to_ask + beyond))
        offsets_task.add_done_callback(consume_exception)
        if ids is not None:
            s.oor = self._under_ids(set(await ids), s.oor, s.budget, s.reads, s.errors, s.rejected)
            beyond = [k for k in beyond if self.partition(k) is not None]
        gaps = {k: loop.create_task(self.across_the_gap(k, offsets_task)) for k in beyond}
        await self._purgatory(s.reads, s.rejected, gaps)
        try:
            fresh = await asyncio.wait_for(asyncio.shield(offsets_task),
                                           timeout=max(0.05, self.deadline - loop.time()))
        except (TimeoutError, OSError, ConnectionError):
            fresh = {}
        # what was known when the answer chose not to ask stands, though it aged past STALE_OFFSETS_S meanwhile
        return self._answer(upstream, s, {**known, **self.last_known(s.oor + beyond, fresh)}, gaps)

    def _to_ask(self, s: Settled) -> tuple[list[Key], dict[Key, BrokerOffsets]]:
        """The partitions whose leader's offsets this answer asks: those it reads (records go out with the leader's
        offsets of the last second) and those with none known from the last STALE_OFFSETS_S seconds. An empty answer
        (beyond this fetch's budget) takes the last known: asking the leaders for every partition a wide fetch
        names, on every fetch, made its cost follow the fetch's partition count, not the partitions it reads.
        Returns them and the last known offsets of the others."""
        known = self.last_known([k for k in s.oor if k not in s.budget], {})
        return [k for k in s.oor if k in s.budget or k not in known], known

    def _answer(self, upstream: FetchResponse | BrokerPart, s: Settled, offsets: dict[Key, BrokerOffsets],
                gaps: dict[Key, asyncio.Task[Entry | None]]) -> Answer:
        """The tier's entries (and the gaps') in place of the broker's own for those partitions."""
        broker_entry = broker_entries(self.plan, upstream)
        entries: dict[Key, Entry] = {}
        for key in s.oor:
            entries[key] = self.remote_entry(key, broker_entry(key), offsets.get(key), s.reads.get(key),
                                             s.errors.get(key))
        for key, task in gaps.items():
            if not task.done():  # the leader did not answer in time: retriable, the client asks again
                task.cancel()
                entries[key] = partition_entry(key[1], None, None, None)
                entries[key]["error_code"] = OFFSETS_UNKNOWN
            elif (entry := task.result()) is not None:
                entries[key] = entry
        served = sum(len(entries[k]["records"] or b"") for k in s.oor if k in entries)
        if served:
            self.tier.quota.served(self.plan.client_id, served)
        return answer_of(self.plan, upstream, entries, s.throttle_ms)

    def _under_ids(self, current: set[Key], oor: list[Key], budget: Budget, reads: Reads, errors: dict[Key, int],
                   rejected: set[Key]) -> list[Key]:
        """The partitions the tier answers under the topics' current ids (the others keep the broker's answer);
        one whose read was started under another id than its current one is read again (never served from the
        old topic's history)."""
        oor = [k for k in oor if k in current]
        stale = {k: budget[k] for k in oor if k in reads and k in budget
                 and self.plan.read_from.get(k) is not self.partition(k)}
        if stale:
            for k in stale:
                reads.pop(k)
            again, failed, refused = self.start_reads(stale)
            reads.update(again)
            errors.update(failed)
            rejected |= refused
        return oor

    def _reads_for(self, budget: Budget, wanted: Budget) -> tuple[Reads, dict[Key, int], set[Key]]:
        """The final budget's reads: an early read stands if the budget still allows what it was started with."""
        plan = self.plan
        early = {k: t for k, t in plan.reads.items() if k in budget and plan.budget.get(k, budget[k]) <= budget[k]}
        late = {k: b for k, b in budget.items() if k not in early and k not in plan.errors}
        reads, errors, rejected = self.start_reads(late)
        reads.update(early)
        errors.update({k: e for k, e in plan.errors.items() if k in budget})
        rejected |= {k for k in plan.rejected if k in budget and k not in early}
        rejected |= set(wanted) - set(budget)  # no memory left for them now: empty at the deadline, like a full pool
        return reads, errors, rejected

    async def _purgatory(self, reads: Reads, rejected: set[Key], gaps: dict[Key, asyncio.Task[Entry | None]]) -> None:
        if not (reads or rejected or gaps):
            return
        loop = asyncio.get_running_loop()
        self.stats.purgatory += 1
        try:
            if reads or gaps:
                await asyncio.wait([*reads.values(), *gaps.values()], timeout=max(0.0, self.deadline - loop.time()))
            else:  # the pool refused every read: answer empty at the deadline (backpressure, no error)
                await asyncio.sleep(max(0.0, self.deadline - loop.time()))
        finally:
            self.stats.purgatory -= 1

    def remote_entry(self, key: Key, broker_entry: Entry | None, broker: BrokerOffsets | None,
                     task: asyncio.Task[ReadResult] | None, error: int | None) -> Entry:
        """One remote partition's answer: records read in time, an error from the table, or empty (expired)."""
        plan, stats = self.plan, self.stats
        pc = self.partition(key)
        entry = partition_entry(key[1], broker_entry, broker, pc.earliest_offset() if pc else -1)
        topic = pc.tp.topic if pc else str(key[0])
        if error is not None:
            entry["error_code"] = error
        elif broker is None:
            # no high watermark, last stable offset or log start from the leader: records without them would show
            # the consumer a lag of our own making (Java records-lag, Streams idling); it retries the same offset
            entry["error_code"] = OFFSETS_UNKNOWN
            stats.offsets_unknown += 1
        elif task is None and key not in plan.requested_reads:
            pass  # beyond this fetch's byte budget: empty, no error, read on a later fetch
        elif task is None or not task.done():
            stats.expired += 1  # expired in purgatory: empty records, no error; the read warms the cache
        elif (failure := task.exception()) is not None:
            stats.failed(topic)
            entry["error_code"] = error_for(failure)
            if isinstance(failure, ObjectMissing) and self.tier_answers(key):
                # the metadata still says the tier holds it: a lost object, not data gone. OFFSET_OUT_OF_RANGE would
                # reset the client past records that exist; Kafka answers remote storage failures as this
                entry["error_code"] = LOST_OBJECT
            log.warning("remote read %s failed: %s", key, failure)
        else:
            res = task.result()
            # sent as its own chunk: not copied again (a file region: by sendfile, never read here)
            entry["records"] = (res.records if isinstance(res.records, FileRegion | RecordPieces)
                                else memoryview(res.records))
            stats.served(topic, len(res.records))
            if plan.read_committed:
                entry["aborted_transactions"] = [{"producer_id": a.producer_id, "first_offset": a.first_offset}
                                                 for a in res.aborted]
            if broker.log_start > 0:
                self.tiered[key] = broker.log_start
        return entry

    async def across_the_gap(self, key: Key, offsets_task: asyncio.Task[dict[Key, BrokerOffsets]]) -> Entry | None:
        """A fetch the tier does not serve and the broker no longer holds, inside a hole between tiered segments
        or past the tier's end: records deleted before they were tiered (the tiering job reports the gap).
        Answered with a batch of no records up to the first offset above it that either holds
        (`rules.resume_offset`: the broker's log start, or the next tiered segment), as over a batch the log
        cleaner emptied: the client moves there and its next fetch is answered by whichever holds it. Never
        records from above a hole while the broker still holds part of it, nor the broker's records below its log
        start. None: the offset is ahead of the log by the leader's answer to this fetch, the broker's
        OFFSET_OUT_OF_RANGE stands (never on an older answer: retriable instead). Reads nothing."""
        pc = self.partition(key)
        if pc is None:
            return None
        try:
            fresh = await asyncio.shield(offsets_task)
        except (OSError, TimeoutError, ConnectionError):
            fresh = {}
        broker = self.last_known([key], fresh).get(key)
        offset = self.plan.fetch_offset(key)
        if broker is not None and broker.log_start <= offset:
            if key in fresh:
                return None
            # an older answer's log start may have moved past the offset since: only a fresh one may say "ahead
            # of the log" (the client would reset); a log start only grows, so an older one may still show a gap
            broker = None
        entry = partition_entry(key[1], None, broker, pc.earliest_offset())
        if broker is None:  # cannot tell ahead-of-log from gap: retriable, never a reset
            entry["error_code"] = OFFSETS_UNKNOWN
            self.stats.offsets_unknown += 1
            return entry
        following = pc.next_segment_after(offset)
        resume = resume_offset(offset, following.start_offset if following is not None else None, broker.log_start)
        self.stats.gap_skips += 1
        log.warning("%s-%d: offsets %d..%d are neither tiered nor on the broker (deleted before they were tiered): "
                    "the client reads on from %d", pc.tp.topic, pc.tp.partition, offset, resume - 1, resume)
        entry["records"] = memoryview(build_empty_batch(offset, resume - 1))
        return entry

    # --- the leaders' offsets and the topics' current ids ---------------------------------------------------------
    async def under_current_ids(self, oor: list[Key]) -> list[Key]:
        """The partitions the tier still answers once the names' current ids are at most a second old; the others
        (a topic deleted and created again since it was tiered) keep the broker's answer."""
        names = {str(k[0]) for k in oor}
        await self._early_lookups()
        try:
            await asyncio.wait_for(self.tier.refresh_topic_ids(names),
                                   timeout=max(0.05, self.deadline - asyncio.get_running_loop().time()))
        except (OSError, TimeoutError, ConnectionError, KeyError) as exc:
            log.debug("current topic ids of %s not asked: %s", names, exc)  # go with the ids known
        return [k for k in oor if self.tier_answers(k)]

    async def broker_offsets(self, keys: list[Key]) -> dict[Key, BrokerOffsets]:
        """HW, LSO and log start of each remote partition, asked of its leader with tierproxy's own identity (one
        ListOffsets per leader and bound for all of them)."""
        await self._early_lookups()
        return await self._ask_offsets(keys)

    async def _ask_offsets(self, keys: list[Key]) -> dict[Key, BrokerOffsets]:
        names: dict[tuple[str, int], Key] = {}
        for key in keys:
            pc = self.partition(key)
            if pc is not None:
                names[(pc.tp.topic, key[1])] = key
        got = await self.tier.broker_offsets_many(list(names))
        return {names[k]: v for k, v in got.items()}

    def last_known(self, keys: list[Key], fresh: dict[Key, BrokerOffsets]) -> dict[Key, BrokerOffsets]:
        """Where the leader could not be asked in time: its answer of the last STALE_OFFSETS_S seconds (a fetch
        response's high watermark is a snapshot anyway). Never an offset of our own making."""
        out = dict(fresh)
        for key in keys:
            pc = self.partition(key) if key not in out else None
            if pc is not None and (last := self.tier.last_broker_offsets(pc.tp.topic, key[1], STALE_OFFSETS_S)):
                out[key] = last
        return out


def consume_exception(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()
