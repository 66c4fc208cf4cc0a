"""KIP-227 fetch sessions the proxy holds for a client reading the tier (`intercept.fetch.sessions`): a client of
many partitions names only what changed, and gets only what is new, while the broker still answers (and authorizes)
the whole session sessionless. Session errors, closing, the end of a catch-up and the process-wide bound."""

from __future__ import annotations

import os
from typing import Any

import pytest

from protocol.constants import ApiKey, ErrorCode
from protocol.records import iter_batches
from protocol.requests import fetch_request
from tests.support.inprocess import InProcessProxy, Wire, run
from tests.support.memory_tier import InMemoryTier
from tierproxy.proxy.intercept.fetch import sessions
from tierproxy.proxy.intercept.fetch.answer import partition_entry
from tierproxy.tier.model import TopicIdPartition

Data = dict[str, Any]
TOPIC, TOPIC_ID, N = "sess", os.urandom(16), 50


def _tier(log_start: int = 500) -> InMemoryTier:
    tier = InMemoryTier()
    for p in range(N):
        tier.segment(TopicIdPartition(TOPIC, TOPIC_ID, p), 0, 199, per_batch=10, value_bytes=100)
        tier.leader(TOPIC, p, log_start=log_start, high_watermark=1000)
    tier.script.slots = 20  # a fetch reads 20 partitions
    return tier


def _body(version: int, offsets: dict[int, int], session: tuple[int, int], forgotten: list[int] | None = None
          ) -> Data:
    body = fetch_request({TOPIC: offsets}, max_bytes=50 << 20, partition_max_bytes=1500,
                         topic_ids={TOPIC: TOPIC_ID} if version >= 13 else None)
    body["session_id"], body["session_epoch"] = session
    body["forgotten_topics_data"] = [{"topic": TOPIC, "topic_id": TOPIC_ID, "partitions": forgotten}] if forgotten \
        else []
    return body


def _out_of_range(version: int, asked: Data) -> Data:
    """The broker: every partition the forwarded request names is below its log start."""
    return {"throttle_time_ms": 0, "error_code": 0, "session_id": 0, "node_endpoints": [], "responses": [
        {"topic": t["topic"], "topic_id": t["topic_id"], "partitions": [
            partition_entry(p["partition"], None, None, None) | {"error_code": ErrorCode.OFFSET_OUT_OF_RANGE}
            for p in t["partitions"]]} for t in asked["topics"]]}


async def _exchange(wire: Wire, proxy: InProcessProxy, version: int, body: Data,
                    broker: Any = _out_of_range) -> tuple[Data | None, Data]:
    """(what the broker got, decoded; what the client got)"""
    from protocol import registry

    wire.client_sends(ApiKey.FETCH, version, body)
    got = wire.broker_receives()
    asked = None
    if got:
        [(header, frame)] = got
        asked = registry.decode_request(header, memoryview(frame))
        wire.broker_answers(header, broker(version, asked))
        await proxy.settle()
    [(_, _, answer)] = wire.client_receives()
    assert answer is not None
    return asked, answer


async def _start(wire: Wire, proxy: InProcessProxy, version: int, offsets: dict[int, int]) -> tuple[int, Data]:
    """A client's first full requests: the first finds its partitions in the tier (nothing known of them yet: no
    session, as before sessions), the next asks again (a Java client does after an answer without a session) and,
    reading the tier, is granted one. Returns its id and that full answer; `offsets` follow the records read."""
    _, cold = await _exchange(wire, proxy, version, _body(version, offsets, (0, 0)))
    assert cold["session_id"] == 0
    offsets.update(_records(cold))
    asked, first = await _exchange(wire, proxy, version, _body(version, offsets, (0, 0)))
    assert asked is not None and (asked["session_id"], asked["session_epoch"]) == (0, -1)
    assert first["session_id"] != 0 and first["error_code"] == 0
    assert sum(len(t["partitions"]) for t in first["responses"]) == len(offsets)  # a full answer: every partition
    return first["session_id"], first


def _caught_up(version: int, asked: Data) -> Data:
    """The broker: every partition the forwarded request names at its log start (20), nothing new."""
    answer = _out_of_range(version, asked)
    for t in answer["responses"]:
        for p in t["partitions"]:
            p.update({"error_code": 0, "high_watermark": 1000, "last_stable_offset": 1000, "log_start_offset": 20})
    return answer


def _records(answer: Data) -> dict[int, int]:
    """partition → the next offset after the records it was answered (partitions with records only)."""
    out = {}
    for t in answer["responses"]:
        for p in t["partitions"]:
            if batches := list(iter_batches(p["records"])):
                out[p["partition_index"]] = batches[-1].last_offset + 1
    return out


@pytest.mark.parametrize("version", [12, 13, 17])
def test_a_session_names_what_changed_and_answers_what_is_new(version: int) -> None:
    async def go() -> None:
        proxy = InProcessProxy(_tier())
        wire = Wire(proxy)
        offsets = dict.fromkeys(range(N), 0)
        before = sessions.held()  # (other tests' proxies are dropped without closing their connections)
        sid, first = await _start(wire, proxy, version, offsets)
        read = _records(first)
        assert len(read) == 20
        offsets.update(read)
        seen = set(read)
        for epoch in (1, 2):  # the client names only the partitions whose position moved
            asked, answer = await _exchange(wire, proxy, version, _body(version, read, (sid, epoch)))
            assert asked is not None and (asked["session_id"], asked["session_epoch"]) == (0, -1)
            # upstream: the whole session, each at the client's position
            assert {p["partition"]: p["fetch_offset"] for t in asked["topics"] for p in t["partitions"]} == offsets
            assert answer["session_id"] == sid and answer["error_code"] == 0
            listed = [p["partition_index"] for t in answer["responses"] for p in t["partitions"]]
            read = _records(answer)
            assert sorted(listed) == sorted(read) and len(read) == 20  # only what is new
            assert not set(read) & seen or epoch == 2  # the next 20 first: those answered last went last
            seen |= set(read)
            offsets.update(read)
        assert len(seen) == N
        assert sessions.held() == before + N
        # a wrong epoch: refused, nothing forwarded
        asked, wrong = await _exchange(wire, proxy, version, _body(version, {}, (sid, 9)))
        assert asked is None and (wrong["error_code"], wrong["session_id"], wrong["responses"]) == (71, 0, [])
        # closed (epoch -1): a sessionless full request of what it names
        asked, closed = await _exchange(wire, proxy, version, _body(version, {0: offsets[0]}, (sid, -1)))
        assert asked is not None and [p["partition"] for t in asked["topics"] for p in t["partitions"]] == [0]
        assert closed["session_id"] == 0 and sessions.held() == before
        asked, gone = await _exchange(wire, proxy, version, _body(version, {}, (sid, 4)))
        assert asked is None and gone["error_code"] == 70

    run(go())


def test_forgotten_partitions_leave_the_session_and_a_closed_connection_releases_it() -> None:
    async def go() -> None:
        proxy = InProcessProxy(_tier())
        wire = Wire(proxy)
        before = sessions.held()
        sid, _ = await _start(wire, proxy, 12, dict.fromkeys(range(N), 0))
        asked, _ = await _exchange(wire, proxy, 12, _body(12, {}, (sid, 1), forgotten=list(range(10, N))))
        assert asked is not None and sorted(p["partition"] for t in asked["topics"] for p in t["partitions"]) \
            == list(range(10))
        assert sessions.held() == before + 10
        wire.session.close()
        assert sessions.held() == before

    run(go())


def test_a_caught_up_client_leaves_its_session_and_goes_back_to_the_relay() -> None:
    """The tier holds 0..19 and the broker from 20: once the client's positions are the broker's, its next
    incremental request is answered FETCH_SESSION_ID_NOT_FOUND, and its next full request gets no session."""
    async def go() -> None:
        tier = _tier()
        proxy = InProcessProxy(tier)
        wire = Wire(proxy)
        before = sessions.held()  # (other tests' proxies are dropped without closing their connections)
        tier.segment(TopicIdPartition(TOPIC, TOPIC_ID, N), 0, 19, per_batch=10, value_bytes=100)
        tier.leader(TOPIC, N, log_start=20, high_watermark=1000)  # its tier: 0..19, the broker's log from 20
        offsets = {N: 0}
        sid, first = await _start(wire, proxy, 12, offsets)
        offsets.update(_records(first))
        assert offsets == {N: 20}

        _, second = await _exchange(wire, proxy, 12, _body(12, {N: 20}, (sid, 1)), broker=_caught_up)
        assert second["session_id"] == sid and second["error_code"] == 0
        asked, ended = await _exchange(wire, proxy, 12, _body(12, {}, (sid, 2)))
        assert asked is None and ended["error_code"] == 70 and sessions.held() == before
        _, full = await _exchange(wire, proxy, 12, _body(12, {N: 20}, (0, 0)), broker=_caught_up)
        assert full["session_id"] == 0  # relayed as the broker answered it

    run(go())


def test_sessions_stay_within_their_process_wide_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past `SESSION_PARTITIONS` a full request gets no session (session id 0): the client goes on with full
    requests, as before sessions; memory stays within the bound whatever clients ask."""
    monkeypatch.setattr(sessions, "SESSION_PARTITIONS", sessions.held() + N - 1)

    async def go() -> None:
        proxy = InProcessProxy(_tier())
        wire = Wire(proxy)
        offsets = dict.fromkeys(range(N), 0)
        for _ in range(2):  # the second full request would be granted a session: not past the bound
            _, full = await _exchange(wire, proxy, 12, _body(12, offsets, (0, 0)))
            assert full["session_id"] == 0 and len(_records(full)) == 20
            offsets.update(_records(full))

    run(go())


@pytest.mark.parametrize("field, value", [("preferred_read_replica", 2),
                                          ("diverging_epoch", {"epoch": 3, "end_offset": 5})])
def test_a_preferred_replica_or_diverging_epoch_is_listed_in_every_answer(field: str, value: Any) -> None:
    """Kafka's `CachedPartition.maybeUpdateResponseData` lists a partition whose answer names a preferred read
    replica or a diverging epoch every time, changed or not: a Java client that could not act on it the first time
    (the replica offline in its metadata, its fetch discarded) learns it from the next answer, or waits forever."""
    async def go() -> None:
        proxy = InProcessProxy(_tier())
        wire = Wire(proxy)
        offsets = dict.fromkeys(range(N), 0)
        sid, _ = await _start(wire, proxy, 12, offsets)

        def pointed(version: int, asked: Data) -> Data:
            answer = _out_of_range(version, asked)
            for t in answer["responses"]:
                for p in t["partitions"]:
                    if p["partition_index"] == 0:  # the broker's: no records, the same each time
                        p.update({"error_code": 0, "high_watermark": 1000, "last_stable_offset": 1000,
                                  "log_start_offset": 0, field: value})
            return answer

        for epoch in (1, 2):
            _, answer = await _exchange(wire, proxy, 12, _body(12, {}, (sid, epoch)), broker=pointed)
            got = {p["partition_index"]: p[field] for t in answer["responses"] for p in t["partitions"]}
            assert got.get(0) == value, f"epoch {epoch}: partition 0 left out"

    run(go())


def test_an_incremental_request_cannot_grow_sessions_past_their_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bound holds for partitions an incremental request adds, not only for a full request's: past it the
    session ends (FETCH_SESSION_ID_NOT_FOUND, as a broker's evicted session), and the client's next full request is
    answered without one."""
    monkeypatch.setattr(sessions, "SESSION_PARTITIONS", sessions.held() + N + 5)

    async def go() -> None:
        proxy = InProcessProxy(_tier())
        wire = Wire(proxy)
        offsets = dict.fromkeys(range(N), 0)
        sid, _ = await _start(wire, proxy, 12, offsets)
        more = dict.fromkeys(range(N, N + 10), 0)
        _, answer = await _exchange(wire, proxy, 12, _body(12, more, (sid, 1)))
        assert sessions.held() <= sessions.SESSION_PARTITIONS
        assert answer["error_code"] == 70 and answer["session_id"] == 0
        asked, full = await _exchange(wire, proxy, 12, _body(12, offsets | more, (0, 0)))
        assert asked is not None and full["session_id"] == 0 and full["error_code"] == 0

    run(go())


def test_a_full_request_of_a_caught_up_client_ends_its_session() -> None:
    """A full request ends the session its connection held, on the relay's path too (the client caught up): else
    the session's partitions count against the process-wide bound until the connection closes."""
    async def go() -> None:
        tier = _tier()
        proxy = InProcessProxy(tier)
        wire = Wire(proxy)
        before = sessions.held()
        tier.segment(TopicIdPartition(TOPIC, TOPIC_ID, N), 0, 19, per_batch=10, value_bytes=100)
        tier.leader(TOPIC, N, log_start=20, high_watermark=1000)
        offsets = {N: 0}
        sid, _ = await _start(wire, proxy, 12, offsets)
        assert sessions.held() == before + 1

        await _exchange(wire, proxy, 12, _body(12, {N: 20}, (sid, 1)), broker=_caught_up)
        _, full = await _exchange(wire, proxy, 12, _body(12, {N: 20}, (0, 0)), broker=_caught_up)
        assert full["session_id"] == 0
        assert sessions.held() == before

    run(go())


def test_session_errors_are_the_brokers() -> None:
    """As Kafka's `FetchManager.newContext`: an incremental request without a session id names no session
    (FETCH_SESSION_ID_NOT_FOUND: session id 0 is never a cached one), and one of the held session at a version
    that does not match its topic ids is FETCH_SESSION_TOPIC_ID_ERROR (the Java client then closes it and asks its
    metadata again); neither is forwarded."""
    async def go() -> None:
        proxy = InProcessProxy(_tier())
        wire = Wire(proxy)
        sid, _ = await _start(wire, proxy, 13, dict.fromkeys(range(N), 0))
        asked, no_id = await _exchange(wire, proxy, 13, _body(13, {}, (0, 1)))
        assert asked is None and (no_id["error_code"], no_id["session_id"]) == (70, 0)
        asked, by_name = await _exchange(wire, proxy, 12, _body(12, {}, (sid, 1)))
        assert asked is None and (by_name["error_code"], by_name["session_id"]) == (106, 0)

    run(go())
