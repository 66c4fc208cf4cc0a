"""In-process tests of the Fetch intercept's split and merge (no broker, no sockets): a mixed remote/local fetch
reads early what it expects to be remote but forwards every partition, and the client gets exactly its partitions
back, in request order."""

from __future__ import annotations

import asyncio
from typing import cast

import pytest

from protocol import registry
from protocol.constants import ApiKey, ErrorCode
from protocol.headers import RequestHeader, decode_request_header
from protocol.messages import FetchRequest, FetchResponse
from protocol.requests import fetch_request
from tierproxy.proxy.intercept.errors import READ_FAILURES, error_for
from tierproxy.proxy.intercept.fetch.answer import Entry, merge_response, partition_entry
from tierproxy.proxy.intercept.fetch.plan import Key, plan_fetch
from tierproxy.remote.pool import PoolFull, ReaderPool
from tierproxy.remote.view import BrokerOffsets
from tierproxy.tier.storage import ObjectMissing, StorageUnavailable


def request(offsets: dict[str, dict[int, int]]) -> FetchRequest:
    """A client's Fetch as the proxy sees it: encoded and decoded by the codec, as fetch_request receives it."""
    header = RequestHeader(ApiKey.FETCH, 12, 1, "c", 2, 0)
    frame = memoryview(b"".join(bytes(c) for c in registry.encode_request(
        header, fetch_request(offsets, max_bytes=1 << 20))))[4:]
    return cast(FetchRequest, registry.decode_request(decode_request_header(frame), frame))


def test_a_fetch_with_nothing_known_reads_nothing_early() -> None:
    plan = plan_fetch(request({"a": {0: 5, 1: 7}}), False, {})
    assert plan.remote == [] and plan.reads == {}


def test_partitions_below_the_brokers_start_are_read_early_the_rest_forgotten() -> None:
    req = request({"a": {0: 5, 1: 500, 2: 9}, "b": {0: 1}})
    known: dict[Key, int] = {("a", 0): 100, ("a", 1): 100, ("b", 0): 50}  # remote, and the broker's local start
    plan = plan_fetch(req, False, known)
    assert plan.remote == [("a", 0), ("b", 0)]
    assert known == {("a", 0): 100, ("b", 0): 50}  # a-1 caught up with the broker: forgotten
    assert plan.request["topics"] == req["topics"]  # the broker is asked for every partition (authorization)


def test_merge_answers_exactly_the_requested_partitions_in_request_order() -> None:
    req = request({"a": {2: 0, 0: 0, 1: 0}, "b": {3: 0}})
    plan = plan_fetch(req, False, {("a", 0): 10, ("b", 3): 10})
    broker_hw, tier_hw = 111, 222  # which side answered a partition, told by its high watermark

    def entry(partition: int, hw: int) -> Entry:
        e = partition_entry(partition, None, None, None)
        e["high_watermark"] = hw
        return e

    broker: FetchResponse = {"throttle_time_ms": 3, "error_code": 0, "session_id": 0, "node_endpoints": [],
                             "responses": [{"topic": "a", "topic_id": bytes(16), "partitions": [
                                 entry(1, broker_hw), entry(2, broker_hw), entry(9, broker_hw)]}]}
    entries: dict[Key, Entry] = {("a", p["partition_index"]): p for p in broker["responses"][0]["partitions"]}
    entries[("a", 0)] = entry(0, tier_hw)
    entries[("b", 3)] = entry(3, tier_hw)
    merged = merge_response(plan, broker, entries)
    got = [(t["topic"], p["partition_index"], p["high_watermark"]) for t in merged["responses"]
           for p in t["partitions"]]
    assert got == [("a", 2, broker_hw), ("a", 0, tier_hw), ("a", 1, broker_hw), ("b", 3, tier_hw)]  # 9: not asked
    assert merged["throttle_time_ms"] == 3 and merged["session_id"] == 0


def test_an_all_remote_answer_is_a_well_formed_fetch_response() -> None:
    plan = plan_fetch(request({"a": {0: 1}}), False, {("a", 0): 10})
    entry = partition_entry(0, None, BrokerOffsets(120, 110, 10, 0.0), tier_start=0)
    entry["records"] = memoryview(b"")
    merged = merge_response(plan, None, {("a", 0): entry})
    frame = registry.joined(registry.encode_response(ApiKey.FETCH, 12, 7, merged))
    back = registry.decode_response(ApiKey.FETCH, 12, memoryview(frame)[4:], 5)
    p = back["responses"][0]["partitions"][0]
    assert (p["high_watermark"], p["last_stable_offset"], p["log_start_offset"]) == (120, 110, 0)
    assert p["error_code"] == ErrorCode.NONE


def test_partition_fields_are_never_made_up_from_the_tier_when_the_leader_was_not_asked() -> None:
    entry = partition_entry(3, None, None, tier_start=5)
    assert (entry["high_watermark"], entry["last_stable_offset"], entry["log_start_offset"]) == (-1, -1, 5)


@pytest.mark.parametrize(("failure", "code"), [
    (ObjectMissing("k"), ErrorCode.OFFSET_OUT_OF_RANGE),
    (StorageUnavailable("s3 down"), ErrorCode.KAFKA_STORAGE_ERROR),
    (RuntimeError("a bug"), ErrorCode.UNKNOWN_SERVER_ERROR),
])
def test_the_error_table(failure: BaseException, code: ErrorCode) -> None:
    assert error_for(failure) == code


def test_the_error_table_names_each_failure_once() -> None:
    kinds = [k for k, _ in READ_FAILURES]
    assert len(kinds) == len(set(kinds))


def test_a_full_pool_is_pool_full() -> None:
    async def run() -> None:
        pool = ReaderPool(1, 0)
        gate = asyncio.Event()
        first = pool.submit(gate.wait)
        with pytest.raises(PoolFull):
            pool.submit(gate.wait)
        gate.set()
        await first

    asyncio.run(run())
