"""Fetch over the tiered range: forward first, read remotely where the broker says OFFSET_OUT_OF_RANGE.

Routing: each Fetch goes to the broker (so its authorization stays in force). A partition answered
OFFSET_OUT_OF_RANGE whose offset lies in the tier becomes a remote read; the connection remembers it (with the
broker's local log start) so later fetches below that start skip the broker round trip, and go back to the
broker once the offset reaches it. A mixed request is split, and the answers merged into one response holding
exactly the requested partitions, in request order.

Purgatory: one delayed operation per request waits for all its remote reads in parallel, completed when they
finish or at `remote.fetch.max.wait.ms`; an expired partition is answered with empty records and no error (its
read goes on warming the cache). Errors: reader pool full → UNKNOWN_SERVER_ERROR at once; storage unavailable
until the deadline → KAFKA_STORAGE_ERROR; segment deleted meanwhile → OFFSET_OUT_OF_RANGE.
Response fields: high watermark and last stable offset are the broker's; log start offset is the tier's start.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from protocol import registry
from protocol.connection import RequestEvent, ResponseEvent
from protocol.constants import ErrorCode
from tierproxy import rewrite
from tierproxy.admin.metrics import FETCH_LATENCY
from tierproxy.remote.pool import PoolFull
from tierproxy.remote.reader import ReadResult
from tierproxy.remote.service import RemoteTier
from tierproxy.session import Session, Slot
from tierproxy.tier.cache import PartitionCache
from tierproxy.tier.storage import ObjectMissing, StorageUnavailable

log = logging.getLogger("tierproxy.remote.fetch")
Key = tuple[Any, int]  # (topic name or topic id, partition)


@dataclass
class FetchCtx:
    request: dict[str, Any]
    by_id: bool  # v13+: topics named by id
    local: list[Key] = field(default_factory=list)  # answered by the proxy without asking the broker
    started: float = field(default_factory=time.monotonic)


def _key(by_id: bool, topic: dict[str, Any], p: dict[str, Any]) -> Key:
    return (topic["topic_id"] if by_id else topic["topic"], p["partition"])


def _pc(tier: RemoteTier, by_id: bool, key: Key) -> PartitionCache | None:
    return tier.partition_by_id(key[0], key[1]) if by_id else tier.partition(key[0], key[1])


def fetch_request(session: Session, ev: RequestEvent) -> None:
    tier: RemoteTier | None = session.proxy.remote
    if not registry.supports(ev.header.api_key, ev.header.api_version):
        session.forward(ev)
        return
    data = registry.decode_request(ev.header, ev.frame)
    changed = not (data["session_id"] == 0 and data["session_epoch"] == -1)
    if changed:  # KIP-227 sessions are not forwarded: sessionless upstream, session_id 0 back
        data["session_id"], data["session_epoch"], data["forgotten_topics_data"] = 0, -1, []
    by_id = ev.header.api_version >= 13
    ctx = FetchCtx(data, by_id)
    known: dict[Key, int] = session.state.setdefault("remote", {})
    if tier is not None and known:
        upstream_topics = []
        for t in data["topics"]:
            kept = []
            for p in t["partitions"]:
                key = _key(by_id, t, p)
                local_start = known.get(key)
                if local_start is not None and p["fetch_offset"] < local_start:
                    ctx.local.append(key)
                elif local_start is not None:
                    del known[key]  # caught up with the broker's log: back to the broker
                    kept.append(p)
                else:
                    kept.append(p)
            if kept:
                upstream_topics.append({**t, "partitions": kept})
        if ctx.local:
            slot = Slot(ev.header, ctx=ctx)
            if upstream_topics:
                session.forward(ev, registry.encode_request(ev.header, {**data, "topics": upstream_topics}), slot)
            else:
                session.add_slot(slot)
                session.complete_later(slot, complete(session, slot, None, ctx, []))
            return
    slot = Slot(ev.header, ctx=ctx)
    session.forward(ev, registry.encode_request(ev.header, data) if changed else None, slot)


def fetch_response(session: Session, slot: Slot, ev: ResponseEvent) -> None:
    ctx: FetchCtx | None = slot.ctx
    tier: RemoteTier | None = session.proxy.remote
    if ctx is None or tier is None or not registry.supports(ev.api_key, ev.api_version):
        rewrite.relay_with_endpoints(session, slot, ev)
        return
    data = registry.decode_response(ev.api_key, ev.api_version, ev.frame, ev.body_offset)
    requested = {_key(ctx.by_id, t, p): p for t in ctx.request["topics"] for p in t["partitions"]}
    oor: list[Key] = []
    for t in data["responses"]:
        for p in t["partitions"]:
            if p["error_code"] != ErrorCode.OFFSET_OUT_OF_RANGE:
                continue
            key = (t["topic_id"] if ctx.by_id else t["topic"], p["partition_index"])
            pc = _pc(tier, ctx.by_id, key)
            req = requested.get(key)
            if pc is not None and req is not None and pc.segment_for_offset(req["fetch_offset"]) is not None:
                oor.append(key)
    if not oor and not ctx.local:
        rewrite.relay_with_endpoints(session, slot, ev, data)
        FETCH_LATENCY.labels("tail").observe(time.monotonic() - ctx.started)
        return
    session.complete_later(slot, complete(session, slot, (ev, data), ctx, oor))


async def complete(session: Session, slot: Slot, upstream: tuple[ResponseEvent, dict[str, Any]] | None,
                   ctx: FetchCtx, oor: list[Key]) -> None:
    """The delayed remote fetch: read every remote partition in parallel, answer at completion or deadline."""
    tier = session.proxy.remote
    assert tier is not None
    loop = asyncio.get_running_loop()
    settings = session.proxy.settings
    deadline = loop.time() + settings.remote_fetch_max_wait_ms / 1000
    request = ctx.request
    version = slot.header.api_version
    read_committed = request["isolation_level"] == 1
    requested = {_key(ctx.by_id, t, p): p for t in request["topics"] for p in t["partitions"]}
    broker_entries: dict[Key, dict[str, Any]] = {}
    if upstream is not None:
        for t in upstream[1]["responses"]:
            for p in t["partitions"]:
                broker_entries[(t["topic_id"] if ctx.by_id else t["topic"], p["partition_index"])] = p
    remote_keys = oor + ctx.local
    known: dict[Key, int] = session.state.setdefault("remote", {})
    leaders = _leaders(session, ctx, remote_keys)
    reads: dict[Key, asyncio.Task[ReadResult]] = {}
    errors: dict[Key, int] = {}
    for key in remote_keys:
        pc = _pc(tier, ctx.by_id, key)
        p = requested[key]
        md = pc.segment_for_offset(p["fetch_offset"]) if pc else None
        if pc is None or md is None:
            errors[key] = ErrorCode.OFFSET_OUT_OF_RANGE
            known.pop(key, None)
            continue
        following = [m for m in pc.finished() if m.start_offset > md.end_offset]
        max_bytes = min(p["partition_max_bytes"], request.get("max_bytes", 1 << 30))
        def read(md: Any = md, offset: int = p["fetch_offset"], following: Any = following,
                 max_bytes: int = max_bytes) -> Any:
            return tier.reader.read(md, offset, max_bytes, True, read_committed, deadline, following)

        try:
            reads[key] = tier.pool.submit(read)
            reads[key].add_done_callback(_consume_exception)
        except PoolFull as exc:
            log.warning("%s", exc)
            errors[key] = ErrorCode.UNKNOWN_SERVER_ERROR
    offsets_task = loop.create_task(_broker_offsets(tier, leaders))
    offsets_task.add_done_callback(_consume_exception)
    if reads:
        tier.purgatory += 1
        try:
            await asyncio.wait(list(reads.values()), timeout=max(0.0, deadline - loop.time()))
        finally:
            tier.purgatory -= 1
    try:
        offsets = await asyncio.wait_for(asyncio.shield(offsets_task), timeout=max(0.05, deadline - loop.time()))
    except (TimeoutError, OSError, ConnectionError):
        offsets = {}
    entries: dict[Key, dict[str, Any]] = dict(broker_entries)
    for key in remote_keys:
        pc = _pc(tier, ctx.by_id, key)
        broker = offsets.get(key)
        tier_end = pc.latest_tiered_offset() if pc else -1
        entry = _entry(key[1], broker_entries.get(key), broker, tier_end, pc.earliest_offset() if pc else -1)
        task = reads.get(key)
        if key in errors:
            entry["error_code"] = errors[key]
        elif task is not None and task.done():
            failure = task.exception()
            if failure is None:
                res = task.result()
                entry["records"] = memoryview(res.records)  # sent as its own chunk: not copied again
                topic = pc.tp.topic if pc else str(key[0])
                tier.stats.add(tier.stats.requests, topic)
                tier.stats.add(tier.stats.bytes, topic, len(res.records))
                if read_committed:
                    entry["aborted_transactions"] = [{"producer_id": a.producer_id, "first_offset": a.first_offset}
                                                     for a in res.aborted]
                if broker is not None and broker.log_start > 0:
                    known[key] = broker.log_start
            else:
                tier.stats.add(tier.stats.errors, pc.tp.topic if pc else str(key[0]))
                entry["error_code"] = (ErrorCode.OFFSET_OUT_OF_RANGE if isinstance(failure, ObjectMissing) else
                                       ErrorCode.KAFKA_STORAGE_ERROR if isinstance(failure, StorageUnavailable) else
                                       ErrorCode.UNKNOWN_SERVER_ERROR)
                log.warning("remote read %s failed: %s", key, failure)
        else:
            tier.expired += 1  # expired in purgatory: empty records, no error; the read warms the cache
        entries[key] = entry
    response = _response(ctx, upstream[1] if upstream else None, entries, slot)
    rewrite.rewrite_node_endpoints(response, session.proxy.brokers.proxy_address)
    slot.chunks = registry.encode_response(1, version, slot.header.correlation_id, response)
    FETCH_LATENCY.labels("remote").observe(time.monotonic() - ctx.started)
    session.flush()


def _consume_exception(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()


def _leaders(session: Session, ctx: FetchCtx, keys: list[Key]) -> dict[Key, tuple[str, str, int]]:
    """(leader address, topic name, partition) for each remote partition: this connection's broker."""
    out = {}
    tier = session.proxy.remote
    assert tier is not None
    for key in keys:
        pc = _pc(tier, ctx.by_id, key)
        if pc is not None and session.upstream_name != "?":
            out[key] = (session.upstream_name, pc.tp.topic, key[1])
    return out


async def _broker_offsets(tier: RemoteTier, leaders: dict[Key, tuple[str, str, int]]) -> dict[Key, Any]:
    got = {}
    for key, (leader, topic, partition) in leaders.items():
        try:
            got[key] = await tier.broker_offsets(leader, topic, partition)
        except (OSError, ConnectionError, TimeoutError, KeyError) as exc:
            log.debug("broker offsets for %s: %s", key, exc)
    return got


def _entry(partition: int, broker_entry: dict[str, Any] | None, broker: Any, tier_end: int,
           tier_start: int | None) -> dict[str, Any]:
    hw = broker.high_watermark if broker is not None and broker.high_watermark >= 0 else tier_end + 1
    lso = broker.last_stable if broker is not None and broker.last_stable >= 0 else hw
    entry = dict(broker_entry) if broker_entry else {}
    entry.update({"partition_index": partition, "error_code": 0, "high_watermark": hw, "last_stable_offset": lso,
                  "log_start_offset": tier_start if tier_start is not None else -1, "diverging_epoch": None,
                  "current_leader": None, "snapshot_id": None, "aborted_transactions": None,
                  "preferred_read_replica": -1, "records": memoryview(b"")})
    entry.pop("_tags", None)
    return entry


def _response(ctx: FetchCtx, broker: dict[str, Any] | None, entries: dict[Key, dict[str, Any]],
              slot: Slot) -> dict[str, Any]:
    """Exactly the requested partitions, in request order (the Java client drops anything else)."""
    topics = []
    for t in ctx.request["topics"]:
        parts = [entries[_key(ctx.by_id, t, p)] for p in t["partitions"] if _key(ctx.by_id, t, p) in entries]
        topics.append({"topic": t.get("topic", ""), "topic_id": t.get("topic_id", bytes(16)), "partitions": parts})
    base = dict(broker) if broker else {"throttle_time_ms": 0, "error_code": 0, "node_endpoints": []}
    base.update({"session_id": 0, "responses": topics})
    return base
