"""A catch-up's steady state answered in the turn of the loop that brings the broker's answer
(`DelayedRemoteFetch.complete_now`): the early read done, the topic's id and the leader's offsets asked less than a
second ago. The broker still decides every fetch first: a refusal or any error but OFFSET_OUT_OF_RANGE is the
client's answer and the read is dropped; anything still to come (a read, offsets to ask, an id to confirm) goes the
waiting way, and both ways give the same answer."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from protocol.constants import ErrorCode
from protocol.records import iter_batches
from tests.support.inprocess import InProcessProxy, Wire, run
from tests.support.memory_tier import InMemoryTier
from tierproxy.proxy.intercept.fetch.answer import Entry, partition_entry
from tierproxy.tier.model import TopicIdPartition

OOR, NONE = ErrorCode.OFFSET_OUT_OF_RANGE, ErrorCode.NONE
TOPIC, TID = "orders", os.urandom(16)
TP0 = TopicIdPartition(TOPIC, TID, 0)
Data = dict[str, Any]


def _tier(at_once: bool) -> InMemoryTier:
    tier = InMemoryTier()
    tier.segment(TP0, 0, 99)
    tier.segment(TP0, 100, 199)
    tier.leader(TOPIC, 0, log_start=500, high_watermark=1000)
    tier.at_once = at_once
    return tier


def _entry(error: int) -> Entry:
    entry = partition_entry(0, None, None, None)
    entry.update({"error_code": error, "high_watermark": 1000, "last_stable_offset": 1000, "log_start_offset": 500,
                  "records": b""})
    return entry


def _answer(error: int) -> Data:
    return {"throttle_time_ms": 0, "error_code": 0, "session_id": 0, "node_endpoints": [],
            "responses": [{"topic": TOPIC, "topic_id": TID, "partitions": [_entry(error)]}]}


class Catchup:
    """One consumer reading the tier from offset 0, fetch after fetch, through an in-process proxy."""

    def __init__(self, tier: InMemoryTier, version: int = 12, **settings: Any) -> None:
        from protocol.requests import fetch_request

        self.tier, self.version, self.fetch_request = tier, version, fetch_request
        self.proxy = InProcessProxy(tier, **settings)
        self.wire = Wire(self.proxy)

    def send(self, offset: int) -> Any:
        from protocol.constants import ApiKey

        body = self.fetch_request({TOPIC: {0: offset}}, max_bytes=2000,
                                  topic_ids={TOPIC: TID} if self.version >= 13 else None)
        self.wire.client_sends(ApiKey.FETCH, self.version, body)
        [(header, _)] = self.wire.broker_receives()
        return header

    async def fetch(self, offset: int, error: int = OOR, settle_read: bool = True) -> tuple[Data, bool]:
        """(the client's answer, whether it came in the broker answer's own turn of the loop)."""
        header = self.send(offset)
        if settle_read:  # the early read (a task of the in-memory tier) is done before the broker answers
            for _ in range(5):
                await asyncio.sleep(0)
        self.wire.broker_answers(header, _answer(error))
        got = self.wire.client_receives()
        at_once = bool(got)
        if not got:
            await self.proxy.settle()
            got = self.wire.client_receives()
        [(_, _, body)] = got
        assert body is not None
        return body, at_once


def _partition(body: Data) -> Data:
    return dict(body["responses"][0]["partitions"][0])


def _walk(tier: InMemoryTier, version: int, fetches: int) -> list[tuple[Data, bool]]:
    out, offset = [], 0

    async def go() -> None:
        nonlocal offset
        c = Catchup(tier, version)
        for _ in range(fetches):
            body, at_once = await c.fetch(offset)
            out.append((body, at_once))
            offset = list(iter_batches(_partition(body)["records"]))[-1].last_offset + 1

    run(go())
    return out


def test_the_steady_state_is_answered_in_the_brokers_turn_with_the_same_bytes_as_waiting() -> None:
    for version in (12, 13):
        waiting = _walk(_tier(False), version, 6)
        at_once_tier = _tier(True)
        at_once = _walk(at_once_tier, version, 6)
        assert [_partition(b) for b, _ in at_once] == [_partition(b) for b, _ in waiting]
        assert not any(now for _, now in waiting)
        # the first fetch asks the leader (and, by name, the id); every later one finds them fresh
        assert [now for _, now in at_once] == [False] + [True] * 5, version
        assert at_once_tier.refreshes == (1 if version < 13 else 0)


def test_a_refusal_or_another_error_of_the_broker_is_the_answer_and_the_read_is_dropped() -> None:
    for error in (ErrorCode.TOPIC_AUTHORIZATION_FAILED, ErrorCode.UNKNOWN_LEADER_EPOCH,
                  ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.FENCED_LEADER_EPOCH):
        async def go(error: int = error) -> None:
            c = Catchup(_tier(True))
            first, _ = await c.fetch(0)
            after = list(iter_batches(_partition(first)["records"]))[-1].last_offset + 1
            reads = len(c.tier.reads)
            refused, now = await c.fetch(after, error)
            assert len(c.tier.reads) == reads + 1  # read early, as every known-remote fetch is
            p = _partition(refused)
            assert (p["error_code"], bytes(p["records"] or b"")) == (error, b""), error
            assert now  # relayed as the broker answered, at once
            again, _ = await c.fetch(after)  # the next fetch is the broker's to decide again
            assert _partition(again)["error_code"] == NONE and _partition(again)["records"]

        run(go())


def test_anything_still_to_come_goes_the_waiting_way() -> None:
    async def go() -> None:
        c = Catchup(_tier(True))
        first, _ = await c.fetch(0)
        after = list(iter_batches(_partition(first)["records"]))[-1].last_offset + 1
        body, now = await c.fetch(after, settle_read=False)  # the broker answered before the read was done
        assert not now and next(iter_batches(_partition(body)["records"])).base_offset == after
        c.tier._remembered.clear()  # the leader's offsets not asked within the second: asked, then answered
        body, now = await c.fetch(after)
        assert not now and _partition(body)["records"] and _partition(body)["high_watermark"] == 1000

    run(go())


def test_a_full_pool_is_still_held_to_the_deadline() -> None:
    """Backpressure stays: a read the pool refuses is answered empty at the deadline, not at once (the client would
    ask again at once, a busy loop)."""
    async def go() -> None:
        c = Catchup(_tier(True), remote_fetch_max_wait_ms=20)
        first, _ = await c.fetch(0)
        after = list(iter_batches(_partition(first)["records"]))[-1].last_offset + 1
        c.tier.script.pool_full = True
        loop = asyncio.get_running_loop()
        started = loop.time()
        body, now = await c.fetch(after)
        assert not now and _partition(body)["error_code"] == NONE and not _partition(body)["records"]
        assert loop.time() - started >= 0.015

    run(go())
