"""ListOffsets and OffsetForLeaderEpoch over the tiered range (forwarded first; the broker's answer is adjusted).

ListOffsets: -2 EARLIEST → the tier's start when tiered data exists below the broker's; -4 EARLIEST_LOCAL →
the broker's local start (as it answers); -5 LATEST_TIERED → the last tiered offset (-1 if none); -1 and -3 as
the broker says; a timestamp ≥ 0 → the tier's time index first (the first record at or after it), then the
broker. OffsetForLeaderEpoch: an epoch older than the broker still knows is answered from the segments' epochs.
DeleteRecords: forwarded; an offset inside the tiered range below the broker's log start becomes the low watermark, and
every log start it moves is recorded, in the tier (`tier.purges`) then in the metadata, before the answer
(`delete_records_response`).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TypeVar, cast

from protocol import registry
from protocol.connection import RequestEvent, ResponseEvent
from protocol.constants import ErrorCode, OffsetSpec
from protocol.messages import (
    DeleteRecordsRequest,
    DeleteRecordsResponse,
    DeleteRecordsResponseTopicPartition,
    ListOffsetsRequest,
    ListOffsetsResponse,
    OffsetForLeaderEpochRequest,
    OffsetForLeaderEpochResponse,
)
from tierproxy.proxy.intercept.errors import LOADING, LOOKUP_FAILED, NOT_RECORDED
from tierproxy.proxy.session import Session, Slot, as_received
from tierproxy.remote.view import RemoteTierView
from tierproxy.tier.cache import PartitionCache
from tierproxy.tier.rules import delete_records_outcome

log = logging.getLogger("tierproxy.proxy.intercept.offsets")
UNDEFINED = -1
M = TypeVar("M")


def forward_remembering_request(session: Session, ev: RequestEvent) -> None:
    """Forward as is; with the tier on, keep the decoded request for the response handler (ListOffsets and
    OffsetForLeaderEpoch answers are adjusted per requested partition)."""
    if session.proxy.remote is None or not registry.supports(ev.header.api_key, ev.header.api_version):
        session.forward(ev)
        return
    session.forward(ev, slot=Slot(ev.header, ctx=registry.decode_request(ev.header, ev.frame)))


def _remembered(session: Session, slot: Slot, ev: ResponseEvent, kind: type[M]) -> tuple[RemoteTierView, M] | None:
    """The tier and the response decoded as `kind` when the request was remembered; otherwise it is relayed."""
    tier = session.proxy.remote
    if slot.ctx is None or tier is None:
        slot.chunks = as_received(ev)
        return None
    return tier, cast(M, registry.decode_response(ev.api_key, ev.api_version, ev.frame, ev.body_offset))


def list_offsets_response(session: Session, slot: Slot, ev: ResponseEvent) -> None:
    if (got := _remembered(session, slot, ev, ListOffsetsResponse)) is None:
        return
    tier, data = got
    request = cast(ListOffsetsRequest, slot.ctx)
    asked = {(t["name"], p["partition_index"]): p["timestamp"] for t in request["topics"] for p in t["partitions"]}
    if not tier.serving:
        _while_loading(session, data, asked)
        slot.chunks = registry.encode_response(ev.api_key, ev.api_version, ev.correlation_id, data)
        return
    searches = []
    for t in data["topics"]:
        for p in t["partitions"]:
            ts = asked.get((t["name"], p["partition_index"]))
            pc = tier.partition(t["name"], p["partition_index"])
            if ts is None or p["error_code"] != 0 or pc is None:
                if ts == OffsetSpec.LATEST_TIERED and p["error_code"] == 0:
                    p["offset"], p["timestamp"], p["leader_epoch"] = -1, -1, -1
                continue
            if ts == OffsetSpec.EARLIEST:
                start = pc.earliest_offset()
                if start is not None and (p["offset"] < 0 or start < p["offset"]):
                    p["offset"], p["timestamp"] = start, -1
                    epoch = pc.epoch_for_offset(start)
                    p["leader_epoch"] = epoch if epoch is not None else -1
            elif ts == OffsetSpec.LATEST_TIERED:
                end = pc.latest_tiered_offset()
                p["offset"], p["timestamp"] = end, -1
                epoch = pc.epoch_for_offset(end) if end >= 0 else None
                p["leader_epoch"] = epoch if epoch is not None else -1
            elif ts >= 0:
                searches.append((p, pc, ts))
    if not searches:
        slot.chunks = registry.encode_response(ev.api_key, ev.api_version, ev.correlation_id, data)
        return

    # every partition looked up at once, within the request's timeout_ms (v10+) or the configured timeout
    asked_timeout = request["timeout_ms"]
    timeout_ms = session.proxy.settings.remote_list_offsets_request_timeout_ms
    timeout = (min(asked_timeout, timeout_ms) if asked_timeout > 0 else timeout_ms) / 1000

    async def finish() -> None:
        deadline = asyncio.get_running_loop().time() + timeout
        results = await asyncio.gather(*(asyncio.wait_for(tier.offset_for_timestamp(pc, ts, deadline), timeout)
                                         for _, pc, ts in searches), return_exceptions=True)
        for (p, pc, _), found in zip(searches, results, strict=True):
            if isinstance(found, BaseException):
                # never the broker's (later, local) answer: it would silently skip the tiered records
                log.warning("timestamp lookup in the tier for %s failed: %r", pc.tp, found)
                p.update({"error_code": LOOKUP_FAILED, "offset": -1, "timestamp": -1, "leader_epoch": -1})
                continue
            if found is not None and (p["offset"] < 0 or found[0] < p["offset"]):
                p["offset"], p["timestamp"] = found
                epoch = pc.epoch_for_offset(found[0])
                p["leader_epoch"] = epoch if epoch is not None else -1
        slot.chunks = registry.encode_response(ev.api_key, ev.api_version, ev.correlation_id, data)
        session.flush()

    session.complete_later(slot, finish())


def _while_loading(session: Session, data: ListOffsetsResponse, asked: dict[tuple[str, int], int]) -> None:
    """The segment metadata is not loaded: an answer that could lie below tiered data (EARLIEST above 0, a
    timestamp found above 0, LATEST_TIERED) becomes REPLICA_NOT_AVAILABLE (retriable, as Kafka answers while its
    RLMM initializes), never the broker's local start, which would make the client skip the history."""
    for t in data["topics"]:
        for p in t["partitions"]:
            ts = asked.get((t["name"], p["partition_index"]))
            if ts is None or p["error_code"] != 0:
                continue
            if (ts == OffsetSpec.EARLIEST and p["offset"] > 0) or ts == OffsetSpec.LATEST_TIERED or (
                    ts >= 0 and p["offset"] != 0):
                p.update({"error_code": LOADING, "offset": -1, "timestamp": -1, "leader_epoch": -1})
                session.proxy.fetch_stats.loading_retriable += 1


def offset_for_leader_epoch_response(session: Session, slot: Slot, ev: ResponseEvent) -> None:
    if (got := _remembered(session, slot, ev, OffsetForLeaderEpochResponse)) is None:
        return
    tier, data = got
    request = cast(OffsetForLeaderEpochRequest, slot.ctx)
    asked = {(t["topic"], p["partition"]): p["leader_epoch"] for t in request["topics"] for p in t["partitions"]}
    changed = False
    for t in data["topics"]:
        for p in t["partitions"]:
            epoch = asked.get((t["topic"], p["partition"]))
            pc = tier.partition(t["topic"], p["partition"])
            if epoch is None or pc is None or p["error_code"] != 0:
                continue
            found = pc.end_offset_for_epoch(epoch)
            if found is None or found == (p["leader_epoch"], p["end_offset"]):
                continue
            # the broker does not know the epoch, or its epoch cache starts at its local log start (a broker without
            # tiered storage truncates it there) while the tier saw the next epoch begin: the tier's lineage decides
            broker_unsure = p["end_offset"] == UNDEFINED or p["leader_epoch"] == UNDEFINED or p["leader_epoch"] > epoch
            if broker_unsure or found[1] <= pc.latest_tiered_offset():
                p["leader_epoch"], p["end_offset"] = found
                changed = True
    slot.chunks = (registry.encode_response(ev.api_key, ev.api_version, ev.correlation_id, data) if changed
                   else as_received(ev))


def delete_records_response(session: Session, slot: Slot, ev: ResponseEvent) -> None:
    """DeleteRecords as Kafka with tiered storage answers it (`tier.rules.delete_records_outcome`): the broker
    authorizes and answers every partition; an offset inside the tiered range below the broker's log start becomes
    the low watermark. Every log start it moves on a tiered partition (the broker's part included) is recorded in
    the metadata, every replica's view, before the answer goes back; a partition whose record cannot be written
    is answered KAFKA_STORAGE_ERROR (retriable: the client's retry records it). Only the topic's current id is
    touched: the history of a topic deleted and created again under the same name is not this topic's."""
    if (got := _remembered(session, slot, ev, DeleteRecordsResponse)) is None:
        return
    tier, data = got
    request = cast(DeleteRecordsRequest, slot.ctx)
    asked = {(t["name"], p["partition_index"]): p["offset"] for t in request["topics"] for p in t["partitions"]}
    answered = [(t["name"], p) for t in data["topics"] for p in t["partitions"]
                if p["error_code"] == ErrorCode.NONE and (t["name"], p["partition_index"]) in asked]
    if not answered:  # refused by the broker (authorization, unknown partition, beyond the high watermark)
        slot.chunks = as_received(ev)
        return
    timeout = min(max(request["timeout_ms"], 1000), 60_000) / 1000

    async def record(p: DeleteRecordsResponseTopicPartition, pc: PartitionCache, log_start: int) -> None:
        try:
            await asyncio.wait_for(tier.put_log_start(pc.tp, log_start), timeout)
        except Exception as exc:
            log.error("%s-%d: the purge below %d could not be recorded in the tier (its purge record) or the remote "
                      "log metadata (%s: %s); answered KAFKA_STORAGE_ERROR. The storage must take a PUT under "
                      "purges/, and tierproxy's own principal needs WRITE on the metadata topic (docs/proxy.md "
                      "'Secured clusters')", pc.tp.topic, pc.tp.partition, log_start,
                      type(exc).__name__, exc)
            p.update({"error_code": NOT_RECORDED, "low_watermark": -1})
            return
        log.info("%s-%d purged below %d (DeleteRecords from %s), recorded", pc.tp.topic, pc.tp.partition, log_start,
                 session.peer)

    async def finish() -> None:
        # a purge moves a tiered log start for good: it goes by the topics' ids asked now (max_age 0), never by an
        # id remembered from before the topic may have been deleted and created again
        confirmed: set[str] = set()
        if tier.serving:
            try:
                confirmed = await asyncio.wait_for(tier.refresh_topic_ids({name for name, _ in answered}, 0),
                                                   timeout)
            except (OSError, TimeoutError, ConnectionError, KeyError) as exc:
                log.warning("DeleteRecords: the topics' current ids could not be asked (%s): tiered partitions are "
                            "answered KAFKA_STORAGE_ERROR, nothing of the tier moves", exc)
        moves = []
        for name, p in answered:
            if not tier.serving:  # what the tier holds is not known yet: never answer as if it held nothing
                p.update({"error_code": NOT_RECORDED, "low_watermark": -1})
                continue
            pc = tier.partition(name, p["partition_index"])
            if pc is None:
                continue
            if name not in confirmed:  # which id the name has now is not known: retriable, nothing moved
                p.update({"error_code": NOT_RECORDED, "low_watermark": -1})
                continue
            outcome = delete_records_outcome(asked[(name, p["partition_index"])], p["low_watermark"],
                                             pc.earliest_offset())
            p["low_watermark"] = outcome.low_watermark
            if outcome.record is not None and outcome.record > pc.log_start_offset:
                moves.append(record(p, pc, outcome.record))
        await asyncio.gather(*moves)
        slot.chunks = registry.encode_response(ev.api_key, ev.api_version, ev.correlation_id, data)
        session.flush()

    session.complete_later(slot, finish())
