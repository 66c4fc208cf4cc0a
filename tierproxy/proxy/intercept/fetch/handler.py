"""The Fetch handlers: the request goes to the broker (sessionless; partitions this connection reads from the tier
are read early, `DelayedRemoteFetch.start_early`); the broker's answer is relayed as it came unless a partition is
OFFSET_OUT_OF_RANGE where the tier holds the offset, or lies in a gap, or the tier is still loading."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Coroutine
from typing import Any, cast

from protocol import registry
from protocol.apis.fetch_scan import FetchScan, scan_fetch_response
from protocol.connection import RequestEvent, ResponseEvent
from protocol.constants import ApiKey, ErrorCode
from protocol.messages import FetchRequest, FetchResponse
from tierproxy.proxy import relay, rewrite
from tierproxy.proxy.intercept.errors import LOADING
from tierproxy.proxy.intercept.fetch.answer import Answer, BrokerPart, Spliced
from tierproxy.proxy.intercept.fetch.delayed import DelayedRemoteFetch, tiered_partition
from tierproxy.proxy.intercept.fetch.plan import (
    FINAL_EPOCH,
    FetchPlan,
    Key,
    as_full_request,
    decode_fetch_request,
    key_of,
    plan_fetch,
    sessionless,
)
from tierproxy.proxy.intercept.fetch.sessions import (
    INVALID_SESSION_EPOCH,
    SESSION_ID_NOT_FOUND,
    SESSION_TOPIC_ID_ERROR,
    FetchSession,
    session_error,
)
from tierproxy.proxy.intercept.fetch.window import broker_decided, no_broker_part, within_window
from tierproxy.proxy.metrics import FETCH_LATENCY
from tierproxy.proxy.session import Session, Slot
from tierproxy.remote.view import RemoteTierView

log = logging.getLogger("tierproxy.proxy.intercept.fetch")
TAIL_LATENCY, REMOTE_LATENCY = FETCH_LATENCY.labels("tail"), FETCH_LATENCY.labels("remote")  # looked up once


def delayed_fetch(session: Session, tier: RemoteTierView, plan: FetchPlan) -> DelayedRemoteFetch:
    """The plan's delayed operation; its deadline is the plan's (set at the request), or max wait from now."""
    proxy = session.proxy
    deadline = plan.deadline or asyncio.get_running_loop().time() + proxy.settings.remote_fetch_max_wait_ms / 1000
    return DelayedRemoteFetch(tier, plan, proxy.fetch_stats, proxy.request_budget, session.tiered, deadline)


def fetch_request(session: Session, ev: RequestEvent) -> None:
    tier = session.proxy.remote
    if not registry.supports(ev.header.api_key, ev.header.api_version):
        session.forward(ev)
        return
    by_id = ev.header.api_version >= 13
    first, session.first_fetch = session.first_fetch, False
    if tier is None or not (session.tiered or (first and tier.serving)):  # the tail: nothing to read early
        chunks = as_full_request(ev)
        if chunks is not None:
            end_session(session)  # a full (or sessionless) request: the one held is over
            plan = FetchPlan(None, by_id, ev)
            plan.client_id = ev.header.client_id or ""
            plan.as_file = session.sends_files
            session.forward(ev, chunks, Slot(ev.header, ctx=plan, on_drop=lambda: release_memory(session, plan)))
            return
    data = decode_fetch_request(ev)
    asked = data["session_id"], data["session_epoch"]
    changed = asked != (0, FINAL_EPOCH)
    held = None
    if changed:
        held = session_of(session, data, by_id)
        if isinstance(held, int):  # a session error: answered at once, nothing forwarded
            session.answer_locally(ev.header, registry.encode_response(
                ApiKey.FETCH, ev.header.api_version, ev.header.correlation_id, session_error(held)))
            return
        if held is not None:
            data = held.apply(data)
        sessionless(data)
    known = session.tiered if tier is not None else {}
    if first and tier is not None:  # a new connection: what the tier knows of the leaders' log starts
        known = expected_remote(tier, data, by_id)
    plan = plan_fetch(data, by_id, known)
    plan.client_id = ev.header.client_id or ""
    plan.as_file = session.sends_files
    if held is not None:
        plan.session_answer = lambda r, s=held: s.answer(r, full=False)
    elif asked[1] == 0 and plan.remote and tier is not None and tier.serving and ev.header.api_version >= 7 \
            and FetchSession.fits(data):
        session.fetch_session = s = FetchSession(data, by_id)  # reads the tier: a session of its own
        session.proxy.fetch_stats.sessions_opened += 1
        plan.session_answer = lambda r: s.answer(r, full=True)
    op = None
    if plan.remote and tier is not None:
        plan.deadline = asyncio.get_running_loop().time() + session.proxy.settings.remote_fetch_max_wait_ms / 1000
        op = delayed_fetch(session, tier, plan)
        if within_window(session.authorized, session.proxy.settings.remote_authorization_cache_ms, op):
            op.start_early()
            slot = Slot(ev.header, ctx=plan, on_drop=lambda: release_memory(session, plan))
            session.add_slot(slot)
            session.proxy.fetch_stats.within_window += 1
            answering = op.complete(no_broker_part(plan), list(plan.remote), [])
            session.complete_later(slot, complete(session, slot, op, answering))
            return
    # a full request goes as it came but for its epoch (`as_full_request`); only an incremental one is re-encoded
    upstream = (as_full_request(ev) or registry.encode_request(ev.header, data)) if changed else None
    session.forward(ev, upstream, Slot(ev.header, ctx=plan, on_drop=lambda: release_memory(session, plan)))
    if op is not None:  # after the request has left: the reads overlap the broker's round trip, not delay it
        op.start_early()


def session_of(session: Session, data: FetchRequest, by_id: bool) -> FetchSession | int | None:
    """The client's fetch session this request goes on with; an error code to answer instead; None: the request is
    a full one (a new session may be granted: `fetch_request`). A full or closing request ends the one held."""
    sid, epoch = data["session_id"], data["session_epoch"]
    held: FetchSession | None = session.fetch_session
    if epoch in (0, FINAL_EPOCH):
        end_session(session)
        return None
    if held is None or held.id != sid:  # (id 0 included: never a session's, as in Kafka's cache)
        return SESSION_ID_NOT_FOUND
    if epoch != held.epoch:
        return INVALID_SESSION_EPOCH
    if held.by_id != by_id:  # a version on the other side of v13 than the session's
        return SESSION_TOPIC_ID_ERROR
    # caught up with the broker (the client's fetches go back to the relay), or grown past the process-wide bound:
    # the session ends, as a broker's evicted one
    if not session.tiered or held.grows_past_bound(data):
        end_session(session)
        return SESSION_ID_NOT_FOUND
    return held


def end_session(session: Session) -> None:
    """The connection's fetch session, if any, ends: its partitions no longer count against the bound."""
    if session.fetch_session is not None:
        session.fetch_session.release()
        session.fetch_session = None


def expected_remote(tier: RemoteTierView, data: FetchRequest, by_id: bool) -> dict[Key, int]:
    """The partitions of a connection's first Fetch that are history: the tier holds the fetch offset and the
    leader's log start, as last asked (at load, or by any connection), is above it (a log start only moves up).
    They are read from the request's arrival, as a known connection's are; the broker's answer still decides."""
    out: dict[Key, int] = {}
    for t in data["topics"]:
        for p in t["partitions"]:
            key = key_of(by_id, t, p)
            pc = tiered_partition(tier, key)
            if pc is None or pc.segment_for_offset(p["fetch_offset"]) is None:
                continue
            last = tier.last_broker_offsets(pc.tp.topic, p["partition"], math.inf)
            if last is not None and p["fetch_offset"] < last.log_start:
                out[key] = last.log_start
    return out


def fetch_response(session: Session, slot: Slot, ev: ResponseEvent) -> None:
    plan: FetchPlan | None = slot.ctx
    tier = session.proxy.remote
    if plan is None or tier is None or not registry.supports(ev.api_key, ev.api_version):
        relay.relay_with_endpoints(session, slot, ev)
        return
    # the tail path's only question is "any partition out of range?": a scan answers it without a decode (and,
    # for a connection reading the tier, lists the answer's partitions: in request order, it can be spliced)
    order: list[Key] | None = [] if plan.remote or plan.decoded is not None else None
    scan = scan_fetch_response(ev.frame, ev.api_version, ev.body_offset, order)
    if not scan.errors and not plan.remote:  # the tail: nothing out of range, nothing read early
        relay_answer(session, slot, plan, ev, scan)
        TAIL_LATENCY.observe(time.monotonic() - plan.started)
        return
    if not tier.serving and any(code == ErrorCode.OFFSET_OUT_OF_RANGE for _, _, code in scan.errors):
        release_memory(session, plan)
        data = decode_fetch_response(ev)
        session.complete_later(slot, answer_while_loading(session, slot, data, plan, tier))
        return
    op = delayed_fetch(session, tier, plan)
    oor = remote_after_broker(op, scan)
    broker_decided(session.authorized, plan, oor, scan.errors)
    beyond = past_the_tier(op, scan, oor)
    _drop_unused_reads(session, plan, oor)
    if not oor and not beyond:
        release_memory(session, plan)
        relay_answer(session, slot, plan, ev, scan)
        TAIL_LATENCY.observe(time.monotonic() - plan.started)
        return
    # the broker's bytes stay as they came, the tier's entries spliced in; decoded and merged when NodeEndpoints
    # need rewriting, or the broker's answer is not in request order (a Kafka broker's always is)
    spliced = (not scan.node_endpoints and plan.session_answer is None and order is not None
               and order == list(plan.requested))
    upstream = BrokerPart(ev, scan) if spliced else decode_fetch_response(ev)
    answer = op.complete_now(upstream, oor, beyond)
    if asyncio.iscoroutine(answer):
        session.complete_later(slot, complete(session, slot, op, answer))
        return
    try:  # everything it needed was there: answered in this turn of the loop, no task
        write_answer(session, slot, plan, answer)
    except Exception:
        log.exception("client %s: answering a Fetch from the tier failed; closing the connection", session.peer)
        session.close()
    finally:
        release_memory(session, plan)


def relay_answer(session: Session, slot: Slot, plan: FetchPlan, ev: ResponseEvent, scan: FetchScan) -> None:
    """The broker's answer as it came; in a fetch session, made the session's (decoded, filtered, encoded)."""
    if plan.session_answer is None:
        relay.relay_with_endpoints(session, slot, ev, scan=scan)
        return
    data = plan.session_answer(decode_fetch_response(ev))
    rewrite.rewrite_node_endpoints(data, session.proxy.brokers.proxy_address)
    slot.chunks = registry.encode_response(ApiKey.FETCH, ev.api_version, ev.correlation_id, data)


def decode_fetch_response(ev: ResponseEvent) -> FetchResponse:
    return cast(FetchResponse, registry.decode_response(ev.api_key, ev.api_version, ev.frame, ev.body_offset))


def write_answer(session: Session, slot: Slot, plan: FetchPlan, response: Answer) -> None:
    """The remote fetch's answer into its slot, written in order."""
    if isinstance(response, Spliced):
        slot.chunks = response.chunks(slot.header.correlation_id)
    else:
        if plan.session_answer is not None:
            response = plan.session_answer(response)
        rewrite.rewrite_node_endpoints(response, session.proxy.brokers.proxy_address)
        slot.chunks = registry.encode_response(ApiKey.FETCH, slot.header.api_version, slot.header.correlation_id,
                                               response)
    REMOTE_LATENCY.observe(time.monotonic() - plan.started)
    session.flush()


async def complete(session: Session, slot: Slot, op: DelayedRemoteFetch,
                   answering: Coroutine[Any, Any, Answer]) -> None:
    """Wait for the delayed remote fetch and write its answer; its memory goes back once the bytes leave."""
    try:
        write_answer(session, slot, op.plan, await answering)
    finally:
        release_memory(session, op.plan)


async def answer_while_loading(session: Session, slot: Slot, data: FetchResponse, plan: FetchPlan, tier: RemoteTierView
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
    if plan.session_answer is not None:
        data = plan.session_answer(data)
    rewrite.rewrite_node_endpoints(data, session.proxy.brokers.proxy_address)
    slot.chunks = registry.encode_response(ApiKey.FETCH, slot.header.api_version, slot.header.correlation_id, data)
    session.flush()


def _drop_unused_reads(session: Session, plan: FetchPlan, oor: list[Key]) -> None:
    """Early reads of partitions the broker did not answer OFFSET_OUT_OF_RANGE (authorization refused, data
    now local, leader moved...) are never served; those partitions go back to the broker alone."""
    answered = set(oor)  # a set: a wide fetch has thousands of both
    for key in plan.remote:
        if key not in answered:
            plan.reads.pop(key, None)  # left to finish: it only warms the cache
            plan.errors.pop(key, None)
            session.tiered.pop(key, None)


def remote_after_broker(op: DelayedRemoteFetch, scan: FetchScan) -> list[Key]:
    """The partitions the broker answered OFFSET_OUT_OF_RANGE whose fetch offset the tier holds."""
    return [(topic, partition) for topic, partition, code in scan.errors if code == ErrorCode.OFFSET_OUT_OF_RANGE
            and (topic, partition) in op.plan.requested and op.tier_answers((topic, partition))]


def past_the_tier(op: DelayedRemoteFetch, scan: FetchScan, oor: list[Key]) -> list[Key]:
    """Partitions of a tiered topic the broker answered OFFSET_OUT_OF_RANGE above the tier's start that the tier
    does not serve: inside a hole between tiered segments, or above the tier's end. Either ahead of the log (the
    broker's answer stands) or in a gap the broker deleted before it was tiered (answered from the first offset the
    tier or the broker holds, not reset to the tier's start: that loops). Which one, the leader's offsets tell."""
    out: list[Key] = []
    served = set(oor)  # a set: a wide fetch has thousands of both (a list made this quadratic)
    for topic, partition, error_code in scan.errors:
        key = (topic, partition)
        if error_code != ErrorCode.OFFSET_OUT_OF_RANGE or key in served or key not in op.plan.requested:
            continue
        pc = op.partition(key)
        start = pc.earliest_offset() if pc is not None else None
        if start is not None and start < op.plan.fetch_offset(key):
            out.append(key)
    return out


def release_memory(session: Session, plan: FetchPlan) -> None:
    """The response is written (or dropped): its grant goes back once the bytes leave the process."""
    if plan.reserved:
        session.hold_until_written(plan.reserved)
        plan.reserved = 0
