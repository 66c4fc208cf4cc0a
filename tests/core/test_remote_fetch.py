"""The remote fetch path in process: a real Session, the real Fetch intercept and codec, between a scripted client
and a scripted broker, over an in-memory tier (`memory_tier.InMemoryTier`). Each test is one scenario of the
delayed remote fetch: out of range → the tier's bytes, budgets, the purgatory, loading, gaps and errors."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from typing import Any

from protocol import registry
from protocol.constants import ApiKey, ErrorCode, IsolationLevel
from protocol.headers import RequestHeader
from protocol.messages import FetchResponse
from protocol.records import Record, build_batch, iter_batches
from protocol.requests import fetch_request
from tests.support.inprocess import InProcessProxy, Wire, run
from tests.support.memory_tier import InMemoryTier
from tierproxy.proxy.intercept.fetch.answer import Entry, partition_entry
from tierproxy.remote.quota import RemoteFetchQuota
from tierproxy.tier.indexes import AbortedTxn
from tierproxy.tier.model import TopicIdPartition
from tierproxy.tier.storage import ObjectMissing, StorageUnavailable

Data = dict[str, Any]
OOR, NONE = ErrorCode.OFFSET_OUT_OF_RANGE, ErrorCode.NONE
TOPIC, TID = "orders", os.urandom(16)
TP0, TP1 = TopicIdPartition(TOPIC, TID, 0), TopicIdPartition(TOPIC, TID, 1)


def broker_entry(partition: int, error: int = NONE, records: bytes = b"", hw: int = 1000, log_start: int = 500
                 ) -> Entry:
    entry = partition_entry(partition, None, None, None)
    entry.update({"error_code": error, "high_watermark": hw, "last_stable_offset": hw, "log_start_offset": log_start,
                  "records": records})
    return entry


def broker_answer(parts: dict[int, Entry], topic: str = TOPIC, topic_id: bytes = TID) -> FetchResponse:
    return {"throttle_time_ms": 0, "error_code": 0, "session_id": 0, "node_endpoints": [],
            "responses": [{"topic": topic, "topic_id": topic_id, "partitions": list(parts.values())}]}


class Scene:
    """One connection through the proxy with an in-memory tier: fetch, let the broker answer, read the answer."""

    def __init__(self, tier: InMemoryTier, **settings: Any) -> None:
        self.tier = tier
        self.proxy = InProcessProxy(tier, **settings)
        self.wire = Wire(self.proxy)

    def send(self, offsets: dict[int, int], version: int = 12, max_bytes: int = 1 << 20,
             partition_max_bytes: int | None = None, isolation: int = IsolationLevel.READ_UNCOMMITTED
             ) -> RequestHeader:
        body = fetch_request({TOPIC: offsets}, max_bytes=max_bytes, partition_max_bytes=partition_max_bytes,
                             isolation=isolation, topic_ids={TOPIC: TID} if version >= 13 else None)
        self.wire.client_sends(ApiKey.FETCH, version, body)
        [(header, _)] = self.wire.broker_receives()
        return header

    async def fetch(self, offsets: dict[int, int], answer: dict[int, Entry], **kw: Any) -> Data:
        header = self.send(offsets, **kw)
        self.wire.broker_answers(header, broker_answer(answer))
        await self.proxy.settle()
        [(_, _, body)] = self.wire.client_receives()
        assert body is not None
        return body


def parts(body: Data) -> dict[int, Data]:
    return {p["partition_index"]: p for t in body["responses"] for p in t["partitions"]}


def scene_run(test: Callable[[Scene], Awaitable[None]], tier: InMemoryTier | None = None, **settings: Any) -> None:
    async def go() -> None:
        t = tier or tiered()
        await test(Scene(t, **settings))

    run(go())


def tiered() -> InMemoryTier:
    """Partition 0 tiered 0..199 (batches of 10), the broker's log from 500 (a gap 200..499), HW 1000."""
    tier = InMemoryTier()
    tier.segment(TP0, 0, 99)
    tier.segment(TP0, 100, 199)
    tier.leader(TOPIC, 0, log_start=500, high_watermark=1000)
    return tier


def test_out_of_range_is_answered_from_the_tier_byte_for_byte() -> None:
    tier = InMemoryTier()
    held = tier.segment(TP0, 0, 99)
    tier.leader(TOPIC, 0, log_start=500, high_watermark=1000, last_stable=990)

    async def go(s: Scene) -> None:
        p = parts(await s.fetch({0: 30}, {0: broker_entry(0, OOR)}))[0]
        assert p["error_code"] == NONE
        assert bytes(p["records"]) == b"".join(held[3:])  # whole batches from the one holding offset 30
        assert (p["high_watermark"], p["last_stable_offset"], p["log_start_offset"]) == (1000, 990, 0)
        assert s.proxy.fetch_stats.bytes[TOPIC] == len(p["records"])

    scene_run(go, tier)


def test_a_fetch_the_broker_serves_passes_byte_for_byte() -> None:
    async def go(s: Scene) -> None:
        header = s.send({0: 600})
        records = build_batch([Record(600, 1, None, b"v")], base_offset=600)
        answer = broker_answer({0: broker_entry(0, records=records)})
        raw = registry.joined(registry.encode_response(ApiKey.FETCH, 12, header.correlation_id, answer))
        s.wire.broker_answers(header, raw)
        await s.proxy.settle()
        [(_, frame, _)] = s.wire.client_receives()
        assert frame == raw[4:] and s.tier.reads == []

    scene_run(go)


def test_a_client_the_broker_refuses_gets_nothing_from_the_tier() -> None:
    async def go(s: Scene) -> None:
        p = parts(await s.fetch({0: 30}, {0: broker_entry(0, ErrorCode.TOPIC_AUTHORIZATION_FAILED)}))[0]
        assert p["error_code"] == ErrorCode.TOPIC_AUTHORIZATION_FAILED and not bytes(p["records"] or b"")
        assert s.tier.reads == []

    scene_run(go)


def test_tier_and_broker_partitions_come_back_in_request_order() -> None:
    tier = tiered()
    tier.segment(TP1, 0, 49)
    tier.leader(TOPIC, 1, log_start=50, high_watermark=80)
    local = build_batch([Record(700, 1, None, b"x")], base_offset=700)

    async def go(s: Scene) -> None:
        body = await s.fetch({1: 10, 0: 5, 2: 700}, {0: broker_entry(0, OOR), 2: broker_entry(2, records=local),
                                                    1: broker_entry(1, OOR)})
        got = [(p["partition_index"], p["error_code"]) for p in body["responses"][0]["partitions"]]
        assert got == [(1, NONE), (0, NONE), (2, NONE)]
        assert bytes(parts(body)[2]["records"]) == local
        assert next(iter_batches(parts(body)[1]["records"])).base_offset == 10

    scene_run(go, tier)


def test_a_fetch_by_topic_id_is_served_from_the_tier() -> None:
    async def go(s: Scene) -> None:
        body = await s.fetch({0: 150}, {0: broker_entry(0, OOR)}, version=13)
        assert body["responses"][0]["topic_id"] == TID
        assert next(iter_batches(parts(body)[0]["records"])).base_offset == 150

    scene_run(go)


def test_the_request_max_bytes_still_gives_one_whole_batch() -> None:
    async def go(s: Scene) -> None:
        p = parts(await s.fetch({0: 0}, {0: broker_entry(0, OOR)}, max_bytes=10))[0]
        assert [b.base_offset for b in iter_batches(p["records"])] == [0]
        assert s.tier.reads[-1][3:] == (10, True)

    scene_run(go)


def test_one_budget_per_request_leaves_later_partitions_for_a_later_fetch() -> None:
    tier = tiered()
    tier.segment(TP1, 0, 99)
    tier.leader(TOPIC, 1, log_start=500, high_watermark=900)
    size = len(tier.data[next(iter(tier.data))][0])

    async def go(s: Scene) -> None:
        body = await s.fetch({0: 0, 1: 0}, {0: broker_entry(0, OOR), 1: broker_entry(1, OOR)}, max_bytes=3 * size)
        assert len(parts(body)[0]["records"]) == 3 * size
        assert parts(body)[1]["error_code"] == NONE and len(parts(body)[1]["records"]) == 0
        assert [r[1] for r in s.tier.reads] == [0]  # partition 1 was not even read
        assert s.proxy.fetch_stats.expired == 0

    scene_run(go, tier)


def test_bytes_the_broker_answered_count_against_the_budget() -> None:
    tier = tiered()
    local = build_batch([Record(700, 1, None, b"y" * 2000)], base_offset=700)

    async def go(s: Scene) -> None:
        body = await s.fetch({1: 700, 0: 0}, {1: broker_entry(1, records=local), 0: broker_entry(0, OOR)},
                             max_bytes=len(local) + 10)
        assert len(parts(body)[0]["records"]) == 0 and parts(body)[0]["error_code"] == NONE
        assert s.tier.reads == [(TOPIC, 0, 0, 10, False)]  # what is left, and no "at least one batch"

    scene_run(go, tier)


def test_a_read_not_done_at_the_deadline_is_answered_empty_without_error() -> None:
    tier = tiered()
    tier.script.gate = asyncio.Event()  # never set: storage hangs

    async def go(s: Scene) -> None:
        p = parts(await s.fetch({0: 0}, {0: broker_entry(0, OOR)}))[0]
        assert p["error_code"] == NONE and len(p["records"]) == 0
        assert s.proxy.fetch_stats.expired == 1 and s.proxy.fetch_stats.purgatory == 0

    scene_run(go, tier, remote_fetch_max_wait_ms=20)


def test_a_full_reader_pool_answers_empty_at_the_deadline() -> None:
    tier = tiered()
    tier.script.pool_full = True

    async def go(s: Scene) -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()
        p = parts(await s.fetch({0: 0}, {0: broker_entry(0, OOR)}))[0]
        assert p["error_code"] == NONE and len(p["records"]) == 0
        assert loop.time() - started >= 0.015  # held to the deadline: backpressure, not a busy loop of retries

    scene_run(go, tier, remote_fetch_max_wait_ms=20)


def test_while_the_metadata_loads_history_is_retriable_not_reset() -> None:
    tier = tiered()
    tier.ready = False

    async def go(s: Scene) -> None:
        p = parts(await s.fetch({0: 30}, {0: broker_entry(0, OOR)}))[0]
        assert p["error_code"] == ErrorCode.REPLICA_NOT_AVAILABLE
        assert s.proxy.fetch_stats.loading_retriable == 1 and s.tier.reads == []

    scene_run(go, tier)


def test_while_the_metadata_loads_a_client_ahead_of_the_log_keeps_the_brokers_answer() -> None:
    tier = tiered()
    tier.ready = False

    async def go(s: Scene) -> None:
        p = parts(await s.fetch({0: 5000}, {0: broker_entry(0, OOR)}))[0]
        assert p["error_code"] == OOR

    scene_run(go, tier)


def test_a_gap_past_the_tier_moves_the_client_to_the_brokers_log_start() -> None:
    async def go(s: Scene) -> None:
        p = parts(await s.fetch({0: 250}, {0: broker_entry(0, OOR)}))[0]
        [batch] = list(iter_batches(p["records"]))
        assert (batch.base_offset, batch.last_offset, batch.records_count) == (250, 499, 0)
        assert s.proxy.fetch_stats.gap_skips == 1

    scene_run(go)


def test_a_hole_between_segments_moves_the_client_to_the_next_segment() -> None:
    tier = InMemoryTier()
    tier.segment(TP0, 0, 99)
    tier.segment(TP0, 300, 399)
    tier.leader(TOPIC, 0, log_start=500, high_watermark=1000)

    async def go(s: Scene) -> None:
        p = parts(await s.fetch({0: 120}, {0: broker_entry(0, OOR)}))[0]
        [batch] = list(iter_batches(p["records"]))
        assert (batch.base_offset, batch.last_offset) == (120, 299)
        p = parts(await s.fetch({0: 300}, {0: broker_entry(0, OOR)}))[0]
        assert next(iter_batches(p["records"])).base_offset == 300

    scene_run(go, tier)


def test_a_client_ahead_of_the_log_keeps_the_brokers_out_of_range() -> None:
    async def go(s: Scene) -> None:
        p = parts(await s.fetch({0: 5000}, {0: broker_entry(0, OOR)}))[0]
        assert p["error_code"] == OOR and s.proxy.fetch_stats.gap_skips == 0

    scene_run(go)


def test_a_gap_whose_leader_cannot_be_asked_is_retriable() -> None:
    tier = tiered()
    tier.leaders[(TOPIC, 0)] = None

    async def go(s: Scene) -> None:
        p = parts(await s.fetch({0: 250}, {0: broker_entry(0, OOR)}))[0]
        assert p["error_code"] == ErrorCode.REPLICA_NOT_AVAILABLE and len(p["records"] or b"") == 0

    scene_run(go, tier)


def test_a_stale_log_start_never_says_ahead_of_the_log() -> None:
    """The leader last answered log start 200; it has since deleted 200..499 (never tiered) and cannot be asked
    now. A fetch at 250 the broker answers OFFSET_OUT_OF_RANGE: by the old answer 250 is "ahead of the log", but
    only a fresh answer may say so (the client would reset): retriable until the leader answers again."""
    tier = tiered()
    tier.leader(TOPIC, 0, log_start=200, high_watermark=1000)

    async def go(s: Scene) -> None:
        p = parts(await s.fetch({0: 30}, {0: broker_entry(0, OOR, log_start=200)}))[0]
        assert p["error_code"] == NONE  # served from the tier; the leader's answer is remembered
        tier.leaders[(TOPIC, 0)] = None
        p = parts(await s.fetch({0: 250}, {0: broker_entry(0, OOR, log_start=500)}))[0]
        assert p["error_code"] == ErrorCode.REPLICA_NOT_AVAILABLE and len(p["records"] or b"") == 0
        assert s.proxy.fetch_stats.offsets_unknown == 1
        tier.leader(TOPIC, 0, log_start=500, high_watermark=1000)  # answers again: the gap is skipped
        p = parts(await s.fetch({0: 250}, {0: broker_entry(0, OOR, log_start=500)}))[0]
        assert p["error_code"] == NONE and s.proxy.fetch_stats.gap_skips == 1

    scene_run(go, tier)


def test_records_without_the_leaders_offsets_are_never_served() -> None:
    tier = tiered()
    tier.leaders[(TOPIC, 0)] = None

    async def go(s: Scene) -> None:
        p = parts(await s.fetch({0: 30}, {0: broker_entry(0, OOR)}))[0]
        assert p["error_code"] == ErrorCode.REPLICA_NOT_AVAILABLE and len(p["records"]) == 0
        assert p["high_watermark"] == -1 and s.proxy.fetch_stats.offsets_unknown == 1

    scene_run(go, tier)


def test_storage_failing_at_the_deadline_is_a_storage_error() -> None:
    tier = tiered()
    tier.script.failure = StorageUnavailable("s3: connection refused")

    async def go(s: Scene) -> None:
        p = parts(await s.fetch({0: 30}, {0: broker_entry(0, OOR)}))[0]
        assert p["error_code"] == ErrorCode.KAFKA_STORAGE_ERROR
        assert s.proxy.fetch_stats.errors[TOPIC] == 1

    scene_run(go, tier)


def test_an_object_lost_while_the_metadata_lists_it_is_retriable_never_a_reset() -> None:
    tier = tiered()
    tier.script.failure = ObjectMissing("orders-0/00000000000000000000.log")

    async def go(s: Scene) -> None:
        p = parts(await s.fetch({0: 30}, {0: broker_entry(0, OOR)}))[0]
        assert p["error_code"] == ErrorCode.UNKNOWN_SERVER_ERROR  # LOST_OBJECT: the client retries the offset

    scene_run(go, tier)


def test_a_bug_in_a_read_is_an_unknown_server_error_and_the_connection_lives() -> None:
    tier = tiered()
    tier.script.failure = RuntimeError("a bug")

    async def go(s: Scene) -> None:
        p = parts(await s.fetch({0: 30}, {0: broker_entry(0, OOR)}))[0]
        assert p["error_code"] == ErrorCode.UNKNOWN_SERVER_ERROR
        assert not s.wire.client.closed and s.proxy.closed_sessions == []

    scene_run(go, tier)


def test_the_next_fetch_reads_the_tier_before_the_broker_answers() -> None:
    async def go(s: Scene) -> None:
        first = parts(await s.fetch({0: 0}, {0: broker_entry(0, OOR)}, max_bytes=2000))[0]
        after = next(iter_batches(first["records"])).last_offset + 1
        assert s.wire.session.tiered == {(TOPIC, 0): 500}
        header = s.send({0: after})
        assert s.tier.reads[-1][2] == after  # started with the request, before the broker's answer
        s.wire.broker_answers(header, broker_answer({0: broker_entry(0, OOR)}))
        await s.proxy.settle()
        [(_, _, body)] = s.wire.client_receives()
        assert body is not None and next(iter_batches(parts(body)[0]["records"])).base_offset == after
        assert len(s.tier.reads) == 2  # the early read was used, not read again

    scene_run(go)


def test_an_early_read_the_broker_does_not_confirm_is_dropped_and_the_partition_forgotten() -> None:
    local = build_batch([Record(150, 1, None, b"z")], base_offset=150)

    async def go(s: Scene) -> None:
        await s.fetch({0: 0}, {0: broker_entry(0, OOR)}, max_bytes=2000)
        body = await s.fetch({0: 150}, {0: broker_entry(0, records=local)})  # the broker holds it again
        assert bytes(parts(body)[0]["records"]) == local
        assert s.wire.session.tiered == {}

    scene_run(go)


def test_a_partition_caught_up_with_the_broker_is_forgotten() -> None:
    async def go(s: Scene) -> None:
        await s.fetch({0: 0}, {0: broker_entry(0, OOR)}, max_bytes=2000)
        reads = len(s.tier.reads)
        s.send({0: 600})
        assert s.wire.session.tiered == {} and len(s.tier.reads) == reads

    scene_run(go)


def test_read_committed_lists_the_aborted_transactions() -> None:
    tier = tiered()
    tier.script.aborted = [AbortedTxn(42, 10, 19, -1)]

    async def go(s: Scene) -> None:
        p = parts(await s.fetch({0: 0}, {0: broker_entry(0, OOR)}, isolation=IsolationLevel.READ_COMMITTED))[0]
        assert p["aborted_transactions"] == [{"producer_id": 42, "first_offset": 10}]

    scene_run(go, tier)


def test_a_spent_remote_fetch_quota_serves_nothing_and_throttles() -> None:
    tier = tiered()
    tier._quota = RemoteFetchQuota(client_rate=1000)

    async def go(s: Scene) -> None:
        first = parts(await s.fetch({0: 0}, {0: broker_entry(0, OOR)}))[0]
        assert len(first["records"]) > 0
        body = await s.fetch({0: 0}, {0: broker_entry(0, OOR)})
        assert len(parts(body)[0]["records"]) == 0 and body["throttle_time_ms"] > 0

    scene_run(go, tier)


def test_memory_for_remote_answers_is_bounded_and_given_back() -> None:
    async def go(s: Scene) -> None:
        budget = s.proxy.request_budget
        budget.used = budget.limit - 1500  # the rest of the process holds all but 1500 bytes
        p = parts(await s.fetch({0: 0}, {0: broker_entry(0, OOR)}))[0]
        assert 0 < len(p["records"]) <= 1500 + 1200  # a whole batch at least; the grant capped the read
        assert s.tier.reads[-1][3] == 1500 and budget.reserved == 0

    scene_run(go)


def test_a_topic_created_again_never_gets_the_old_topics_history() -> None:
    tier = tiered()
    tier.current_ids[TOPIC] = os.urandom(16)  # the name now belongs to a new topic

    async def go(s: Scene) -> None:
        p = parts(await s.fetch({0: 30}, {0: broker_entry(0, OOR)}))[0]
        assert p["error_code"] == OOR and s.tier.reads == []

    scene_run(go, tier)


# --- the authorization window (remote.authorization.cache.ms) -------------------------------------------------------
def _read_on(s: Scene, offset: int) -> RequestHeader:
    """The client's next fetch, which the proxy may answer without the broker: its header."""
    body = fetch_request({TOPIC: {0: offset}}, max_bytes=1 << 20)
    return s.wire.client_sends(ApiKey.FETCH, 12, body)


def test_within_the_authorization_window_history_is_read_without_the_broker() -> None:
    tier = InMemoryTier()
    held = tier.segment(TP0, 0, 99)
    tier.leader(TOPIC, 0, log_start=500, high_watermark=1000, last_stable=990)

    async def go(s: Scene) -> None:
        first = parts(await s.fetch({0: 0}, {0: broker_entry(0, OOR)}))[0]  # the broker authorizes this one
        assert bytes(first["records"]) == b"".join(held)
        _read_on(s, 50)
        await s.proxy.settle()
        assert s.wire.broker_receives() == []  # not asked again
        [(_, _, body)] = s.wire.client_receives()
        assert body is not None
        p = parts(body)[0]
        assert p["error_code"] == NONE and bytes(p["records"]) == b"".join(held[5:])
        assert (p["high_watermark"], p["last_stable_offset"], p["log_start_offset"]) == (1000, 990, 0)
        assert s.proxy.fetch_stats.within_window == 1

    scene_run(go, tier, remote_authorization_cache_ms=60_000)


def test_without_a_window_every_remote_fetch_is_asked_of_the_broker() -> None:
    async def go(s: Scene) -> None:
        await s.fetch({0: 0}, {0: broker_entry(0, OOR)})
        p = parts(await s.fetch({0: 50}, {0: broker_entry(0, ErrorCode.TOPIC_AUTHORIZATION_FAILED)}))[0]
        assert p["error_code"] == ErrorCode.TOPIC_AUTHORIZATION_FAILED and not bytes(p["records"] or b"")
        assert s.proxy.fetch_stats.within_window == 0

    scene_run(go)  # the default, 0


def test_once_the_window_has_passed_the_broker_decides_again_and_a_refusal_sticks() -> None:
    async def go(s: Scene) -> None:
        await s.fetch({0: 0}, {0: broker_entry(0, OOR)})
        for topic in s.wire.session.authorized:  # 250 ms pass: past the 200 ms window, the ACL may be revoked since
            s.wire.session.authorized[topic] -= 0.25
        p = parts(await s.fetch({0: 50}, {0: broker_entry(0, ErrorCode.TOPIC_AUTHORIZATION_FAILED)}))[0]
        assert p["error_code"] == ErrorCode.TOPIC_AUTHORIZATION_FAILED and not bytes(p["records"] or b"")
        # refused: the next fetch is the broker's to decide too, however soon it comes
        p = parts(await s.fetch({0: 50}, {0: broker_entry(0, ErrorCode.TOPIC_AUTHORIZATION_FAILED)}))[0]
        assert p["error_code"] == ErrorCode.TOPIC_AUTHORIZATION_FAILED
        assert s.proxy.fetch_stats.within_window == 0

    scene_run(go, remote_authorization_cache_ms=200)


def test_a_request_with_a_partition_the_tier_does_not_answer_goes_to_the_broker() -> None:
    async def go(s: Scene) -> None:
        await s.fetch({0: 0}, {0: broker_entry(0, OOR)})
        header = s.send({0: 50, 1: 700})  # partition 1 is the broker's alone: the whole request is forwarded
        records = build_batch([Record(700, 1, None, b"v")], base_offset=700)
        s.wire.broker_answers(header, broker_answer({0: broker_entry(0, OOR), 1: broker_entry(1, records=records)}))
        await s.proxy.settle()
        [(_, _, body)] = s.wire.client_receives()
        assert body is not None
        got = parts(body)
        assert bytes(got[0]["records"]) and bytes(got[1]["records"]) == records
        # a fetch in the gap (200..499, never tiered) is not the tier's alone to answer either
        header = s.send({0: 300})
        s.wire.broker_answers(header, broker_answer({0: broker_entry(0, OOR)}))
        await s.proxy.settle()
        [(_, _, body)] = s.wire.client_receives()
        assert body is not None and s.proxy.fetch_stats.within_window == 0

    scene_run(go, remote_authorization_cache_ms=60_000)


def test_reads_go_on_while_the_ids_are_asked_and_one_of_an_old_id_is_never_served() -> None:
    """A fetch by name: the tier's reads start while the topic's current id is asked, not after. Here the answer
    says the topic was created again under a new id (tiered too): the read started under the old id is dropped and
    the partition read again under the new one; the client gets the new topic's bytes only."""
    tier = InMemoryTier()
    tier.segment(TP0, 0, 99)
    new_id = os.urandom(16)
    new = tier.segment(TopicIdPartition(TOPIC, new_id, 0), 0, 49, value_bytes=60)
    tier.leader(TOPIC, 0, log_start=500, high_watermark=1000)
    tier.current_ids[TOPIC] = TID
    tier.ids_on_refresh[TOPIC] = new_id
    tier.refresh_gate = asyncio.Event()

    async def go(s: Scene) -> None:
        header = s.send({0: 0})
        s.wire.broker_answers(header, broker_answer({0: broker_entry(0, OOR)}))
        for _ in range(100):
            await asyncio.sleep(0)
            if tier.reads and tier.refreshes:
                break
        assert tier.refreshes == 1 and len(tier.reads) == 1  # read while the ids are still being asked
        assert tier.refresh_gate is not None
        tier.refresh_gate.set()
        await s.proxy.settle()
        [(_, _, body)] = s.wire.client_receives()
        assert body is not None
        p = parts(body)[0]
        assert p["error_code"] == NONE and bytes(p["records"]) == b"".join(new)
        assert len(tier.reads) == 2  # read again under the current id

    scene_run(go, tier)


async def _warmed(tier: InMemoryTier) -> None:
    """What the remote tier asks when it loads: the tiered partitions' leader offsets (their log starts)."""
    await tier.broker_offsets_many([(TOPIC, 0)])


def test_a_new_connections_first_fetch_of_history_is_read_before_the_broker_answers() -> None:
    """A cold catch-up: the connection has never read from the tier, but the leader's log start as last asked is
    above the fetch offset, so the read, the leader's offsets and the topic's id are asked with the request; the
    broker's OFFSET_OUT_OF_RANGE still decides, and the early read is what is served."""
    async def go(s: Scene) -> None:
        await _warmed(s.tier)
        header = s.send({0: 30})
        assert [r[2] for r in s.tier.reads] == [30] and s.tier.refreshes == 0  # the read, before the broker answers
        await asyncio.sleep(0)
        assert s.tier.refreshes == 1  # the id asked before the broker answers too
        s.wire.broker_answers(header, broker_answer({0: broker_entry(0, OOR)}))
        await s.proxy.settle()
        [(_, _, body)] = s.wire.client_receives()
        assert body is not None and next(iter_batches(parts(body)[0]["records"])).base_offset == 30
        assert len(s.tier.reads) == 1 and s.wire.session.tiered == {(TOPIC, 0): 500}

    scene_run(go)


def test_a_first_fetch_the_tier_knows_nothing_of_or_at_the_log_start_waits_for_the_broker() -> None:
    local = build_batch([Record(600, 1, None, b"z")], base_offset=600)

    async def go(s: Scene) -> None:
        s.send({0: 30})  # no log start known yet: nothing read before the broker answers
        assert s.tier.reads == []
        other = Scene(s.tier)
        await _warmed(s.tier)
        header = other.send({0: 600})  # at or above the broker's log start: the broker's, not history
        assert s.tier.reads == []
        other.wire.broker_answers(header, broker_answer({0: broker_entry(0, records=local)}))
        await other.proxy.settle()
        [(_, _, body)] = other.wire.client_receives()
        assert body is not None and bytes(parts(body)[0]["records"]) == local

    scene_run(go)


def test_a_first_fetch_read_early_that_the_broker_serves_itself_gets_the_brokers_bytes() -> None:
    """The log start learned earlier moved down (a topic's history restored on the broker): the early read is
    never served; the broker's answer passes byte for byte and the connection reads nothing from the tier."""
    local = build_batch([Record(30, 1, None, b"broker")], base_offset=30)

    async def go(s: Scene) -> None:
        await _warmed(s.tier)
        body = await s.fetch({0: 30}, {0: broker_entry(0, records=local, log_start=0)})
        assert len(s.tier.reads) == 1  # read early, then dropped
        assert bytes(parts(body)[0]["records"]) == local and s.wire.session.tiered == {}

    scene_run(go)
