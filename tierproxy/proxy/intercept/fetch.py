"""Fetch over the tiered range: every Fetch goes to the broker; the tier answers only where the broker's answer
to *that* request is OFFSET_OUT_OF_RANGE.

Authorization: the broker authorizes each client request on the client's own connection, so a client without
READ (or whose ACL was removed a moment ago) gets the broker's TOPIC_AUTHORIZATION_FAILED and nothing from the
tier. Speed: a partition this connection already reads from the tier (`known`: below the broker's local log
start) has its remote read started when the request arrives, in parallel with the broker's round trip
(`plan_fetch` → `FetchPlan.remote`); its records are served only if the broker then says OFFSET_OUT_OF_RANGE,
otherwise the read is dropped (it only warmed the cache) and the partition forgotten. The broker answers a
request holding an out-of-range partition at once (`ReplicaManager`: an error completes the fetch), so the
speculation costs no wait. The answers are merged into one response holding exactly the requested partitions,
in request order (`merge_response`).

Purgatory: one delayed operation per request waits for all its remote reads in parallel, completed when they
finish or at `remote.fetch.max.wait.ms`; an expired partition is answered with empty records and no error (its
read goes on warming the cache). Errors come from one table (`intercept.errors`).
Response fields: high watermark and last stable offset are the broker's; log start offset is the tier's start.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from protocol import registry
from protocol.apis.fetch_scan import FetchScan, fetch_request_session, scan_fetch_response
from protocol.connection import RequestEvent, ResponseEvent
from protocol.constants import ApiKey, ErrorCode, IsolationLevel
from protocol.framing import HEAD
from protocol.records import build_empty_batch
from tierproxy.metrics import FETCH_LATENCY, RemoteFetchStats
from tierproxy.proxy import rewrite
from tierproxy.proxy.intercept.errors import LOADING, LOST_OBJECT, OFFSETS_UNKNOWN, SEGMENT_GONE, error_for
from tierproxy.proxy.session import Chunks, Session, Slot, as_received
from tierproxy.remote.pool import PoolFull
from tierproxy.remote.reader import ReadResult
from tierproxy.remote.service import BrokerOffsets, RemoteTier
from tierproxy.tier.cache import PartitionCache
from tierproxy.tier.rules import resume_offset
from tierproxy.tier.storage import ObjectMissing

log = logging.getLogger("tierproxy.proxy.intercept.fetch")
STALE_OFFSETS_S = 30.0
Key = tuple[Any, int]  # (topic name or topic id, partition)
Data = dict[str, Any]
TAIL_LATENCY, REMOTE_LATENCY = FETCH_LATENCY.labels("tail"), FETCH_LATENCY.labels("remote")  # looked up once
FINAL_EPOCH = -1  # KIP-227: a sessionless full request
EPOCH = struct.Struct(">i")  # session_epoch:int32


@dataclass
class FetchPlan:
    """What one client Fetch becomes: its request (made sessionless, forwarded whole) and the partitions
    expected to be remote (below the broker's local start last time), whose reads start before the broker
    answers. A request forwarded as it came is decoded only if its answer needs the tier (`request`)."""

    decoded: Data | None  # the request made sessionless; None: decode `source` on first use
    by_id: bool  # v13+: topics named by id
    source: RequestEvent | None = None
    remote: list[Key] = field(default_factory=list)
    reads: dict[Key, asyncio.Task[ReadResult]] = field(default_factory=dict)  # started early for `remote`
    budget: dict[Key, tuple[int, bool]] = field(default_factory=dict)  # early reads' (max bytes, min one batch)
    rejected: set[Key] = field(default_factory=set)  # early reads a full pool refused
    requested_reads: set[Key] = field(default_factory=set)  # the partitions this fetch's budget reads
    errors: dict[Key, int] = field(default_factory=dict)  # early reads that could not start
    deadline: float = 0.0  # loop time: the purgatory's end (remote.fetch.max.wait.ms after arrival)
    reserved: int = 0  # bytes of queued.max.request.bytes held for this response's remote reads
    client_id: str = ""  # whose remote fetch quota the served bytes count against
    started: float = field(default_factory=time.monotonic)

    @property
    def request(self) -> Data:
        if self.decoded is None:  # kept in `decoded`: decoded once
            assert self.source is not None
            self.decoded = sessionless(registry.decode_request(self.source.header, self.source.frame))
        return self.decoded

    @cached_property
    def requested(self) -> dict[Key, Data]:
        """Each requested partition's entry of the request, by key (built once: the budget, the reads and the
        answers all look partitions up in it)."""
        return {key_of(self.by_id, t, p): p for t in self.request["topics"] for p in t["partitions"]}

    @property
    def read_committed(self) -> bool:
        return bool(self.request["isolation_level"] == IsolationLevel.READ_COMMITTED)


def key_of(by_id: bool, topic: Data, p: Data) -> Key:
    return (topic["topic_id"] if by_id else topic["topic"], p["partition"])


def plan_fetch(request: Data, by_id: bool, known: dict[Key, int]) -> FetchPlan:
    """Which partitions to read early: `known` maps a partition this connection reads from the tier to the
    broker's local log start; a fetch below it is expected remote, at or above it is the broker's (forgotten)."""
    plan = FetchPlan(request, by_id)
    for t in request["topics"]:
        for p in t["partitions"]:
            key = key_of(by_id, t, p)
            local_start = known.get(key)
            if local_start is not None and p["fetch_offset"] < local_start:
                plan.remote.append(key)
            elif local_start is not None:
                del known[key]  # caught up with the broker's log: the broker's alone
    return plan


def fit_budget(plan: FetchPlan, keys: list[Key], answered: int, cap: int | None = None
               ) -> dict[Key, tuple[int, bool]]:
    """One byte budget per request, as `ReplicaManager.readFromLog` keeps it: the request's `max_bytes` less the
    bytes the broker already answered, spent on the remote partitions in request order, each taking up to its
    `partition_max_bytes`. Only the response's first non-empty partition may exceed it (at least one batch:
    `min_one`). Partitions left out get an empty answer with no error and are read on a later fetch; so one fetch
    never starts more reads, nor builds a bigger response, than its budget allows. → {key: (max bytes, min one)}"""
    wanted = set(keys)
    remaining = plan.request.get("max_bytes", 0x7FFFFFFF) - answered
    if cap is not None:  # a remote fetch quota: what it allows now, and nothing at all when spent
        if cap <= 0:
            return {}
        remaining = min(remaining, cap)
    out: dict[Key, tuple[int, bool]] = {}
    for key, p in plan.requested.items():
        if key not in wanted:
            continue
        first = answered == 0 and not out
        if remaining <= 0 and not first:
            break
        size = p["partition_max_bytes"] if remaining <= 0 else min(p["partition_max_bytes"], remaining)
        out[key] = (size, first)
        remaining -= size
    return out


def _pc(tier: RemoteTier, by_id: bool, key: Key) -> PartitionCache | None:
    return tier.partition_by_id(key[0], key[1]) if by_id else tier.partition(key[0], key[1])


def sessionless(data: Data) -> Data:
    """KIP-227 sessions are not forwarded: sessionless upstream (the broker answers session_id 0, so the client
    keeps sending full requests)."""
    data["session_id"], data["session_epoch"], data["forgotten_topics_data"] = 0, -1, []
    return data


def as_full_request(ev: RequestEvent) -> Chunks | None:
    """The request to forward without decoding it, when it asks for no session state: sessionless as it came, or
    a full request (epoch 0) made sessionless by rewriting its epoch (a full request's forgotten topics are
    ignored by the broker). None: it refers to a session (incremental), and goes through the full decode."""
    found = fetch_request_session(ev.frame, ev.header.api_version, ev.header.body_offset)
    if found is None or found[:2] == (0, FINAL_EPOCH):
        return as_received(ev)
    if found[:2] != (0, 0) or ev.wire is None:
        return None
    wire = bytearray(ev.wire)
    EPOCH.pack_into(wire, HEAD + found[2] + 4, FINAL_EPOCH)
    return [wire]


def fetch_request(session: Session, ev: RequestEvent) -> None:
    tier: RemoteTier | None = session.proxy.remote
    if not registry.supports(ev.header.api_key, ev.header.api_version):
        session.forward(ev)
        return
    known: dict[Key, int] = session.state.setdefault("remote", {})
    by_id = ev.header.api_version >= 13
    if tier is None or not known:  # the tail: nothing to read early, so nothing to decode now
        chunks = as_full_request(ev)
        if chunks is not None:
            plan = FetchPlan(None, by_id, ev)
            plan.client_id = ev.header.client_id or ""
            session.forward(ev, chunks, Slot(ev.header, ctx=plan, on_drop=lambda: release_memory(session, plan)))
            return
    data = registry.decode_request(ev.header, ev.frame)
    changed = not (data["session_id"] == 0 and data["session_epoch"] == -1)
    if changed:
        sessionless(data)
    plan = plan_fetch(data, by_id, known if tier is not None else {})
    plan.client_id = ev.header.client_id or ""
    if plan.remote and tier is not None:
        loop = asyncio.get_running_loop()
        plan.deadline = loop.time() + session.proxy.settings.remote_fetch_max_wait_ms / 1000
        plan.budget = within_memory(session, plan, fit_budget(plan, plan.remote, 0))
        plan.reads, plan.errors, plan.rejected = _submit_reads(tier, plan, plan.budget, plan.deadline, known)
    session.forward(ev, registry.encode_request(ev.header, data) if changed else None,
                    Slot(ev.header, ctx=plan, on_drop=lambda: release_memory(session, plan)))


def fetch_response(session: Session, slot: Slot, ev: ResponseEvent) -> None:
    plan: FetchPlan | None = slot.ctx
    tier: RemoteTier | None = session.proxy.remote
    if plan is None or tier is None or not registry.supports(ev.api_key, ev.api_version):
        rewrite.relay_with_endpoints(session, slot, ev)
        return
    # the tail path's only question is "any partition out of range?": a scan answers it without a decode
    scan = scan_fetch_response(ev.frame, ev.api_version, ev.body_offset)
    if not scan.errors and not plan.remote:  # the tail: nothing out of range, nothing read early
        rewrite.relay_with_endpoints(session, slot, ev, scan=scan)
        TAIL_LATENCY.observe(time.monotonic() - plan.started)
        return
    if not tier.serving and any(code == ErrorCode.OFFSET_OUT_OF_RANGE for _, _, code in scan.errors):
        release_memory(session, plan)
        data = registry.decode_response(ev.api_key, ev.api_version, ev.frame, ev.body_offset)
        session.complete_later(slot, answer_while_loading(session, slot, data, plan, tier))
        return
    oor = remote_after_broker(plan, scan, tier)
    beyond = past_the_tier(plan, scan, tier, oor)
    _drop_unused_reads(session, plan, oor)
    if not oor and not beyond:
        release_memory(session, plan)
        rewrite.relay_with_endpoints(session, slot, ev, scan=scan)
        TAIL_LATENCY.observe(time.monotonic() - plan.started)
        return
    data = registry.decode_response(ev.api_key, ev.api_version, ev.frame, ev.body_offset)
    session.complete_later(slot, complete(session, slot, data, plan, oor, beyond))


async def answer_while_loading(session: Session, slot: Slot, data: Data, plan: FetchPlan, tier: RemoteTier
                               ) -> None:
    """The segment metadata is not loaded (or its consumer failed): an offset the broker no longer has may be
    tiered, so OFFSET_OUT_OF_RANGE (which makes the client reset past it) becomes REPLICA_NOT_AVAILABLE, the
    retriable error Kafka answers while its RLMM initializes. Only an offset at or beyond the broker's log start
    (a client ahead of the log, asked by topic name) keeps the broker's answer."""
    requested = plan.requested
    for t in data["responses"]:
        for p in t["partitions"]:
            if p["error_code"] != ErrorCode.OFFSET_OUT_OF_RANGE:
                continue
            key: Key = (t["topic_id"] if plan.by_id else t["topic"], p["partition_index"])
            req = requested.get(key)
            if req is not None and not plan.by_id:
                try:
                    offsets = await asyncio.wait_for(tier.broker_offsets(t["topic"], p["partition_index"]), 5)
                    if 0 <= offsets.log_start <= req["fetch_offset"]:
                        continue  # not history: the broker's answer stands
                except (OSError, ConnectionError, TimeoutError, KeyError) as exc:
                    log.debug("broker offsets for %s: %s", key, exc)
            p["error_code"] = LOADING
    session.proxy.fetch_stats.loading_retriable += 1
    rewrite.rewrite_node_endpoints(data, session.proxy.brokers.proxy_address)
    slot.chunks = registry.encode_response(ApiKey.FETCH, slot.header.api_version, slot.header.correlation_id, data)
    session.flush()


def _drop_unused_reads(session: Session, plan: FetchPlan, oor: list[Key]) -> None:
    """Early reads of partitions the broker did not answer OFFSET_OUT_OF_RANGE (authorization refused, data
    now local, leader moved...) are never served; those partitions go back to the broker alone."""
    known: dict[Key, int] = session.state.setdefault("remote", {})
    for key in plan.remote:
        if key not in oor:
            plan.reads.pop(key, None)  # left to finish: it only warms the cache
            plan.errors.pop(key, None)
            known.pop(key, None)


def remote_after_broker(plan: FetchPlan, scan: FetchScan, tier: RemoteTier) -> list[Key]:
    """The partitions the broker answered OFFSET_OUT_OF_RANGE whose fetch offset the tier holds."""
    oor: list[Key] = []
    for topic, partition, error_code in scan.errors:
        if error_code != ErrorCode.OFFSET_OUT_OF_RANGE:
            continue
        key = (topic, partition)
        pc = _pc(tier, plan.by_id, key)
        req = plan.requested.get(key)
        if pc is not None and req is not None and _tier_answers(pc, req["fetch_offset"]):
            oor.append(key)
    return oor


def past_the_tier(plan: FetchPlan, scan: FetchScan, tier: RemoteTier, oor: list[Key]) -> list[Key]:
    """Partitions of a tiered topic the broker answered OFFSET_OUT_OF_RANGE above the tier's start that the tier
    does not serve: inside a hole between tiered segments, or above the tier's end. Either ahead of the log (the
    broker's answer stands) or in a gap the broker deleted before it was tiered (answered from the first offset the
    tier or the broker holds, not reset to the tier's start: that loops). Which one, the leader's offsets tell."""
    out: list[Key] = []
    for topic, partition, error_code in scan.errors:
        key = (topic, partition)
        if error_code != ErrorCode.OFFSET_OUT_OF_RANGE or key in oor:
            continue
        pc = _pc(tier, plan.by_id, key)
        req = plan.requested.get(key)
        start = pc.earliest_offset() if pc is not None else None
        if start is not None and req is not None and start < req["fetch_offset"]:
            out.append(key)
    return out


async def _under_current_ids(tier: RemoteTier, plan: FetchPlan, oor: list[Key], deadline: float) -> list[Key]:
    """The partitions the tier still answers once the names' current ids are at most a second old; the others
    (a topic deleted and created again since it was tiered) keep the broker's answer."""
    names = {str(k[0]) for k in oor}
    try:
        await asyncio.wait_for(tier.refresh_topic_ids(names),
                               timeout=max(0.05, deadline - asyncio.get_running_loop().time()))
    except (OSError, TimeoutError, ConnectionError, KeyError) as exc:
        log.debug("current topic ids of %s not asked: %s", names, exc)  # go with the ids known
    return [k for k in oor if (pc := _pc(tier, plan.by_id, k)) is not None
            and _tier_answers(pc, plan.requested[k]["fetch_offset"])]


def _tier_answers(pc: PartitionCache, offset: int) -> bool:
    """A served segment holds `offset` (inside a hole the broker may hold it: `past_the_tier`)."""
    return pc.segment_for_offset(offset) is not None


def within_memory(session: Session, plan: FetchPlan, budget: dict[Key, tuple[int, bool]]
                  ) -> dict[Key, tuple[int, bool]]:
    """The part of a fetch's budget the process-wide bound (`queued.max.request.bytes`, shared with requests
    being received) can hold now, in request order; the grant is held until the response is handed to the
    transport. Partitions left out are answered empty at the purgatory's deadline and read on a later fetch."""
    granted = session.proxy.request_budget.reserve(sum(size for size, _ in budget.values()))
    plan.reserved += granted
    out: dict[Key, tuple[int, bool]] = {}
    for key, (size, min_one) in budget.items():
        if granted <= 0:
            break
        out[key] = (min(size, granted), min_one)
        granted -= out[key][0]
    return out


def release_memory(session: Session, plan: FetchPlan) -> None:
    """The response is written (or dropped): its grant goes back once the bytes leave the process."""
    if plan.reserved:
        session.hold_until_written(plan.reserved)
        plan.reserved = 0


async def complete(session: Session, slot: Slot, upstream: Data, plan: FetchPlan, oor: list[Key],
                   beyond: list[Key] | None = None) -> None:
    """The delayed remote fetch: every partition the broker answered out of range and the tier holds is read in
    parallel (reads started early are reused); the answer goes at completion or at the deadline."""
    try:
        await _complete(session, slot, upstream, plan, oor, beyond or [])
    finally:
        release_memory(session, plan)


async def _complete(session: Session, slot: Slot, upstream: Data, plan: FetchPlan, oor: list[Key],
                    beyond: list[Key]) -> None:
    tier = session.proxy.remote
    assert tier is not None
    loop = asyncio.get_running_loop()
    deadline = plan.deadline or loop.time() + session.proxy.settings.remote_fetch_max_wait_ms / 1000
    if not plan.by_id:  # by name: the tier answers only under the topic's current id (never a deleted topic's)
        oor = await _under_current_ids(tier, plan, oor, deadline)
        beyond = [k for k in beyond if _pc(tier, plan.by_id, k) is not None]
    known: dict[Key, int] = session.state.setdefault("remote", {})
    stats = session.proxy.fetch_stats
    answered = sum(len(p["records"] or b"") for t in upstream.get("responses", ()) for p in t["partitions"]
                   if p["error_code"] == 0)
    allowed, throttle_ms = tier.quota.allowance(plan.client_id)
    wanted = fit_budget(plan, oor, answered, allowed)
    session.proxy.request_budget.give_back(plan.reserved)  # the early reads' grant: the final budget takes its own
    plan.reserved = 0
    budget = within_memory(session, plan, wanted)
    plan.requested_reads = set(budget)
    # an early read stands if the budget still allows what it was started with
    early = {k: t for k, t in plan.reads.items() if k in budget and plan.budget.get(k, budget[k]) <= budget[k]}
    late = {k: b for k, b in budget.items() if k not in early and k not in plan.errors}
    reads, errors, rejected = _submit_reads(tier, plan, late, deadline, known)
    reads.update(early)
    errors.update({k: e for k, e in plan.errors.items() if k in budget})
    rejected |= {k for k in plan.rejected if k in budget and k not in early}
    rejected |= set(wanted) - set(budget)  # no memory left for them now: empty at the deadline, like a full pool
    # partitions beyond this fetch's budget have no read and no error: answered empty, read on a later fetch
    offsets_task = loop.create_task(_broker_offsets(tier, plan, oor + beyond))
    offsets_task.add_done_callback(_consume_exception)
    gaps = {k: loop.create_task(_across_the_gap(tier, stats, plan, k, offsets_task)) for k in beyond}
    if reads or rejected or gaps:
        stats.purgatory += 1
        try:
            if reads or gaps:
                await asyncio.wait([*reads.values(), *gaps.values()], timeout=max(0.0, deadline - loop.time()))
            else:  # the pool refused every read: answer empty at the deadline (backpressure, no error)
                await asyncio.sleep(max(0.0, deadline - loop.time()))
        finally:
            stats.purgatory -= 1
    try:
        offsets = await asyncio.wait_for(asyncio.shield(offsets_task), timeout=max(0.05, deadline - loop.time()))
    except (TimeoutError, OSError, ConnectionError):
        offsets = {}
    offsets = _last_known(tier, plan, oor + beyond, offsets)
    broker_entries = {(t["topic_id"] if plan.by_id else t["topic"], p["partition_index"]): p
                      for t in upstream.get("responses", ()) for p in t["partitions"]}
    entries: dict[Key, Data] = dict(broker_entries)
    for key in oor:
        entries[key] = _remote_entry(tier, stats, plan, key, broker_entries.get(key), offsets.get(key), reads.get(key),
                                     errors.get(key), known)
    for key, task in gaps.items():
        if not task.done():  # the leader did not answer in time: retriable, the client asks again
            task.cancel()
            entries[key] = partition_entry(key[1], None, None, None)
            entries[key]["error_code"] = OFFSETS_UNKNOWN
        elif (entry := task.result()) is not None:
            entries[key] = entry
    served = sum(len(entries[k]["records"] or b"") for k in oor if k in entries)
    if served:
        tier.quota.served(plan.client_id, served)
    response = merge_response(plan, upstream, entries)
    if throttle_ms:  # a spent remote fetch quota: the client waits before asking again (KIP-219)
        response["throttle_time_ms"] = max(int(response.get("throttle_time_ms") or 0), throttle_ms)
    rewrite.rewrite_node_endpoints(response, session.proxy.brokers.proxy_address)
    slot.chunks = registry.encode_response(ApiKey.FETCH, slot.header.api_version, slot.header.correlation_id,
                                           response)
    REMOTE_LATENCY.observe(time.monotonic() - plan.started)
    session.flush()


def _submit_reads(tier: RemoteTier, plan: FetchPlan, budget: dict[Key, tuple[int, bool]], deadline: float,
                  known: dict[Key, int]) -> tuple[dict[Key, asyncio.Task[ReadResult]], dict[Key, int], set[Key]]:
    """Start each partition's read in the pool within its budget; partitions that cannot be read get their error
    at once. A full pool (overload across many clients) is not an error: the partition is answered empty at the
    purgatory's deadline, and the client asks again."""
    requested = plan.requested
    reads: dict[Key, asyncio.Task[ReadResult]] = {}
    errors: dict[Key, int] = {}
    rejected: set[Key] = set()
    for key, (max_bytes, min_one) in budget.items():
        pc = _pc(tier, plan.by_id, key)
        p = requested[key]
        try:
            task = (tier.submit_read(pc, p["fetch_offset"], max_bytes, plan.read_committed, deadline, min_one)
                    if pc else None)
        except PoolFull as exc:
            log.warning("%s: %s answered empty", exc, key)
            rejected.add(key)
            continue
        if task is None:  # the segment is gone (or the partition): the broker's answer stands
            errors[key] = SEGMENT_GONE
            known.pop(key, None)
            continue
        task.add_done_callback(_consume_exception)
        reads[key] = task
    return reads, errors, rejected


def _remote_entry(tier: RemoteTier, stats: RemoteFetchStats, plan: FetchPlan, key: Key, broker_entry: Data | None,
                  broker: BrokerOffsets | None, task: asyncio.Task[ReadResult] | None, error: int | None,
                  known: dict[Key, int]) -> Data:
    """One remote partition's answer: records read in time, an error from the table, or empty (expired)."""
    pc = _pc(tier, plan.by_id, key)
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
        offset = plan.requested[key]["fetch_offset"]
        if isinstance(failure, ObjectMissing) and pc is not None and _tier_answers(pc, offset):
            # the metadata still says the tier holds it: a lost object, not data gone. OFFSET_OUT_OF_RANGE would
            # reset the client past records that exist; Kafka answers remote storage failures as this
            entry["error_code"] = LOST_OBJECT
        log.warning("remote read %s failed: %s", key, failure)
    else:
        res = task.result()
        entry["records"] = memoryview(res.records)  # sent as its own chunk: not copied again
        stats.served(topic, len(res.records))
        if plan.read_committed:
            entry["aborted_transactions"] = [{"producer_id": a.producer_id, "first_offset": a.first_offset}
                                             for a in res.aborted]
        if broker is not None and broker.log_start > 0:
            known[key] = broker.log_start
    return entry


async def _across_the_gap(tier: RemoteTier, stats: RemoteFetchStats, plan: FetchPlan, key: Key,
                          offsets_task: asyncio.Task[dict[Key, BrokerOffsets]]) -> Data | None:
    """A fetch the tier does not serve and the broker no longer holds, inside a hole between tiered segments or
    past the tier's end: records deleted before they were tiered (the tiering job reports the gap). Answered with
    a batch of no records up to the first offset above it that either holds (`rules.resume_offset`: the
    broker's log start, or the next tiered segment), as over a batch the log cleaner emptied: the client moves
    there and its next fetch is answered by whichever holds it. Never records from above a hole while the broker
    still holds part of it, nor the broker's records below its log start (a batch straddling a DeleteRecords
    offset). None: the offset is ahead of the log, the broker's OFFSET_OUT_OF_RANGE stands. Reads nothing, so it
    holds no memory beyond its ~61 bytes. Runs beside the fetch's remote reads, within its deadline."""
    pc = _pc(tier, plan.by_id, key)
    req = plan.requested[key]
    if pc is None:
        return None
    try:
        fresh = await asyncio.shield(offsets_task)
    except (OSError, TimeoutError, ConnectionError):
        fresh = {}
    broker = _last_known(tier, plan, [key], fresh).get(key)
    offset = req["fetch_offset"]
    if broker is not None and broker.log_start <= offset:
        return None
    entry = partition_entry(key[1], None, broker, pc.earliest_offset())
    if broker is None:  # cannot tell ahead-of-log from gap: retriable, never a reset
        entry["error_code"] = OFFSETS_UNKNOWN
        stats.offsets_unknown += 1
        return entry
    following = pc.next_segment_after(offset)
    resume = resume_offset(offset, following.start_offset if following is not None else None, broker.log_start)
    stats.gap_skips += 1
    log.warning("%s-%d: offsets %d..%d are neither tiered nor on the broker (deleted before they were tiered): "
                "the client reads on from %d", pc.tp.topic, pc.tp.partition, offset, resume - 1, resume)
    entry["records"] = memoryview(build_empty_batch(offset, resume - 1))
    return entry


def _consume_exception(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()


async def _broker_offsets(tier: RemoteTier, plan: FetchPlan, keys: list[Key]) -> dict[Key, BrokerOffsets]:
    """HW, LSO and log start of each remote partition, asked of its leader with tierproxy's own identity (one
    ListOffsets per leader and bound for all of them)."""
    names: dict[tuple[str, int], Key] = {}
    for key in keys:
        pc = _pc(tier, plan.by_id, key)
        if pc is not None:
            names[(pc.tp.topic, key[1])] = key
    got = await tier.broker_offsets_many(list(names))
    return {names[k]: v for k, v in got.items()}


def _last_known(tier: RemoteTier, plan: FetchPlan, keys: list[Key], fresh: dict[Key, BrokerOffsets]
                ) -> dict[Key, BrokerOffsets]:
    """Where the leader could not be asked in time: its answer of the last STALE_OFFSETS_S seconds (a fetch
    response's high watermark is a snapshot anyway). Never an offset of our own making."""
    out = dict(fresh)
    for key in keys:
        pc = _pc(tier, plan.by_id, key) if key not in out else None
        if pc is not None and (last := tier.last_broker_offsets(pc.tp.topic, key[1], STALE_OFFSETS_S)) is not None:
            out[key] = last
    return out


def partition_entry(partition: int, broker_entry: Data | None, broker: BrokerOffsets | None,
                    tier_start: int | None) -> Data:
    """A remote partition's response entry before records: the leader's HW and LSO (-1 when it could not be asked:
    the entry then carries an error, never records), the tier's start as log start."""
    hw = broker.high_watermark if broker is not None else -1
    lso = broker.last_stable if broker is not None and broker.last_stable >= 0 else hw
    entry = dict(broker_entry) if broker_entry else {}
    entry.update({"partition_index": partition, "error_code": 0, "high_watermark": hw, "last_stable_offset": lso,
                  "log_start_offset": tier_start if tier_start is not None else -1, "diverging_epoch": None,
                  "current_leader": None, "snapshot_id": None, "aborted_transactions": None,
                  "preferred_read_replica": -1, "records": memoryview(b"")})
    entry.pop("_tags", None)
    return entry


def merge_response(plan: FetchPlan, broker: Data | None, entries: dict[Key, Data]) -> Data:
    """Exactly the requested partitions, in request order (the Java client drops anything else)."""
    topics = []
    for t in plan.request["topics"]:
        parts = [entries[k] for p in t["partitions"] if (k := key_of(plan.by_id, t, p)) in entries]
        topics.append({"topic": t.get("topic", ""), "topic_id": t.get("topic_id", bytes(16)), "partitions": parts})
    base = dict(broker) if broker else {"throttle_time_ms": 0, "error_code": 0, "node_endpoints": []}
    base.update({"session_id": 0, "responses": topics})
    return base
