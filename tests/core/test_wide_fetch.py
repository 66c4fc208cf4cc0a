"""A wide fetch (issue 65: one consumer over thousands of partitions, every one named in every sessionless fetch)
from a connection reading a few of them from the tier: the answer is the broker's own bytes with the tier's entries
in their places. Every other partition's entry passes as the broker wrote it, and the proxy decodes or encodes no
response entry but the tier's: its work per fetch follows the partitions the tier answers, not the fetch's
partition count (counted on the codec's response entry points while the proxy answers)."""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import replace
from typing import Any

import pytest

from protocol import registry
from protocol.apis import fetch_splice
from protocol.constants import ApiKey, ErrorCode
from protocol.records import iter_batches
from protocol.requests import fetch_request
from tests.support.inprocess import InProcessProxy, Wire, run
from tests.support.memory_tier import InMemoryTier
from tierproxy.proxy.intercept.fetch.answer import partition_entry
from tierproxy.tier.model import TopicIdPartition

Data = dict[str, Any]
TOPICS = [f"wide-{t}" for t in range(10)]
IDS = {t: os.urandom(16) for t in TOPICS}
PARTITIONS = 100  # 1,000 partitions in every fetch
REMOTE = [("wide-3", 7), ("wide-8", 42)]  # the two the tier answers


def _broker_answer(version: int, offsets: dict[tuple[str, int], int]) -> Data:
    """The broker: OFFSET_OUT_OF_RANGE for the tier's partitions, every other one caught up (no records)."""
    topics = []
    for t in TOPICS:
        parts = []
        for p in range(PARTITIONS):
            entry = partition_entry(p, None, None, None)
            oor = (t, p) in REMOTE
            entry.update({"error_code": ErrorCode.OFFSET_OUT_OF_RANGE if oor else 0, "high_watermark": 1000 + p,
                          "last_stable_offset": 1000 + p, "log_start_offset": 500 if oor else p,
                          "records": b""})
            parts.append(entry)
        topics.append({"topic": t if version < 13 else "", "topic_id": IDS[t], "partitions": parts})
    return {"throttle_time_ms": 0, "error_code": 0, "session_id": 0, "node_endpoints": [], "responses": topics}


class Counted:
    """Fetch response entries the codec decodes or encodes, through the whole-response calls and the one-entry
    ones, while `on`."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.on, self.entries = False, 0
        decode, encode = registry.decode_response, registry.encode_response
        entry_decode, entry_encode = fetch_splice.PARTITION.decode, fetch_splice.PARTITION.encode_into

        def whole(data: Any) -> None:
            if self.on:
                self.entries += sum(len(t["partitions"]) for t in data["responses"])

        def decoding(api_key: int, *args: Any) -> Any:
            out = decode(api_key, *args)
            if api_key == ApiKey.FETCH:
                whole(out)
            return out

        def encoding(api_key: int, version: int, correlation_id: int, data: Any) -> Any:
            if api_key == ApiKey.FETCH:
                whole(data)
            return encode(api_key, version, correlation_id, data)

        def one(fn: Any) -> Any:
            def counted(*args: Any) -> Any:
                self.entries += self.on
                return fn(*args)
            return counted

        monkeypatch.setattr(registry, "decode_response", decoding)
        monkeypatch.setattr(registry, "encode_response", encoding)
        monkeypatch.setattr(fetch_splice.PARTITION, "decode", one(entry_decode))
        monkeypatch.setattr(fetch_splice.PARTITION, "encode_into", one(entry_encode))


@pytest.mark.parametrize("version", [5, 11, 12, 13, 17])
def test_a_wide_fetch_is_answered_with_work_for_the_tiers_partitions_only(monkeypatch: pytest.MonkeyPatch,
                                                                          version: int) -> None:
    tier = InMemoryTier()
    for topic, p in REMOTE:
        tier.segment(TopicIdPartition(topic, IDS[topic], p), 0, 199)
        tier.leader(topic, p, log_start=500, high_watermark=1000)
    counted = Counted(monkeypatch)
    offsets = {(t, p): 0 if (t, p) in REMOTE else p for t in TOPICS for p in range(PARTITIONS)}

    async def fetch(wire: Wire, proxy: InProcessProxy, count: bool) -> tuple[bytes, Data, bytes]:
        """(the broker's answer, the client's answer decoded, its frame)"""
        body = fetch_request({t: {p: offsets[t, p] for p in range(PARTITIONS)} for t in TOPICS}, max_bytes=1 << 20,
                             partition_max_bytes=4096, topic_ids=IDS if version >= 13 else None)
        header = wire.client_sends(ApiKey.FETCH, version, body)
        [(forwarded, _)] = wire.broker_receives()
        assert forwarded.correlation_id == header.correlation_id
        raw = registry.joined(registry.encode_response(ApiKey.FETCH, version, forwarded.correlation_id,
                                                       _broker_answer(version, offsets)))
        counted.on = count
        wire.broker_answers(forwarded, raw)
        await proxy.settle()
        counted.on = False
        [(_, frame, got)] = wire.client_receives()
        assert got is not None
        return raw, got, frame

    async def go() -> None:
        proxy = InProcessProxy(tier)
        wire = Wire(proxy)
        for n in range(3):  # the first fetch finds the tier's partitions; the next ones read on from it
            raw, got, _ = await fetch(wire, proxy, count=n > 0)
            sent = registry.decode_response(ApiKey.FETCH, version, memoryview(raw)[4:], 5 if version >= 12 else 4)
            for topic, t_sent, t_got in zip(TOPICS, sent["responses"], got["responses"], strict=True):
                for p_sent, p_got in zip(t_sent["partitions"], t_got["partitions"], strict=True):
                    key = (topic, p_sent["partition_index"])
                    if key not in REMOTE:
                        assert p_got == p_sent, key  # the broker's entry as it wrote it
                        continue
                    assert p_got["error_code"] == 0 and p_got["log_start_offset"] == 0, (n, p_got)
                    batches = list(iter_batches(p_got["records"]))
                    assert batches and batches[0].base_offset <= offsets[key] <= batches[0].last_offset, (n, p_got)
                    offsets[key] = batches[-1].last_offset + 1
        assert all(offsets[key] > 20 for key in REMOTE)  # read on, fetch after fetch
        # the two later fetches: an entry each for the tier's two partitions, none for the other 998
        assert counted.entries <= 2 * len(REMOTE), counted.entries

    run(go())


class AskedTier(InMemoryTier):
    """The in-memory tier, recording the partitions each ask of the leaders' offsets names."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[int] = []

    async def broker_offsets_many(self, pairs: list[tuple[str, int]], max_age: float = 1.0
                                  ) -> dict[tuple[str, int], Any]:
        self.asked.append(len(pairs))
        return await super().broker_offsets_many(pairs, max_age)


def test_a_wide_catch_up_asks_the_leaders_offsets_of_the_partitions_it_reads() -> None:
    """Every one of 200 partitions out of range on the broker and in the tier, a budget of three partitions a
    fetch: the first fetch asks the leaders for all of them; later ones only for the three they read (the others'
    empty answers carry the offsets last asked), not for the 200 the fetch names."""
    tier, wide = _all_out_of_range()
    offsets = dict.fromkeys(wide, 0)

    async def go() -> None:
        proxy = InProcessProxy(tier)
        wire = Wire(proxy)
        served = []
        for n in range(4):
            header, answer = _fetch_of_a_budget_of_three(wire, offsets)
            asked_before = len(tier.asked)
            wire.broker_answers(header, answer)
            await proxy.settle()
            [(_, _, got)] = wire.client_receives()
            assert got is not None
            read = 0
            for t in got["responses"]:
                for p in t["partitions"]:
                    key = (t["topic"], p["partition_index"])
                    assert p["error_code"] == 0 and p["high_watermark"] == 1000, (n, key, p["error_code"])
                    if batches := list(iter_batches(p["records"])):
                        offsets[key] = batches[-1].last_offset + 1
                        read += 1
            assert read == 3, n
            served.append(tier.asked[asked_before:])
        assert sum(served[0]) >= len(wide)  # the first fetch: nothing known yet
        assert all(sum(later) <= 3 for later in served[1:]), served

    run(go())


def test_offsets_not_asked_again_stand_though_they_age_while_the_reads_wait() -> None:
    """The found case (a fresh-eyes review): an answer chose not to ask the leaders' offsets of the partitions
    beyond its budget (known 29.8 s ago), its reads then took 0.3 s, and it looked them up again, 30.1 s old: every
    such partition was answered REPLICA_NOT_AVAILABLE instead of empty and without error."""
    tier, wide = _all_out_of_range()
    offsets = dict.fromkeys(wide, 0)
    codes: list[dict[int, int]] = []

    async def go() -> None:
        proxy = InProcessProxy(tier)
        wire = Wire(proxy)
        for n in range(2):
            header, answer = _fetch_of_a_budget_of_three(wire, offsets)
            if n == 1:  # the offsets the first fetch asked, now 29.8 s old; this fetch's reads take 0.3 s
                aged = time.monotonic() - 29.8
                for k, o in list(tier._remembered.items()):
                    tier._remembered[k] = replace(o, at=aged)
                tier.script.gate = gate = asyncio.Event()
            wire.broker_answers(header, answer)
            if n == 1:
                await asyncio.sleep(0.3)  # the reads' time (within remote.fetch.max.wait.ms), not a wait for one
                gate.set()
            await proxy.settle()
            [(_, _, got)] = wire.client_receives()
            assert got is not None
            count: dict[int, int] = {}
            for t in got["responses"]:
                for p in t["partitions"]:
                    count[p["error_code"]] = count.get(p["error_code"], 0) + 1
                    if batches := list(iter_batches(p["records"])):
                        offsets[(t["topic"], p["partition_index"])] = batches[-1].last_offset + 1
            codes.append(count)

    run(go())
    assert codes == [{0: len(wide)}, {0: len(wide)}], codes  # before: [{0: 200}, {0: 3, 9: 197}]


def _all_out_of_range() -> tuple[AskedTier, list[tuple[str, int]]]:
    """200 partitions (two topics) the tier holds [0, 199] of, their leader's log start at 500."""
    tier = AskedTier()
    wide = [(t, p) for t in TOPICS[:2] for p in range(PARTITIONS)]
    for topic, p in wide:
        tier.segment(TopicIdPartition(topic, IDS[topic], p), 0, 199)
        tier.leader(topic, p, log_start=500, high_watermark=1000)
    return tier, wide


def _fetch_of_a_budget_of_three(wire: Wire, offsets: dict[tuple[str, int], int]) -> tuple[Any, Data]:
    """A client's v12 fetch of all 200 at `offsets` (room for three partitions' answers), forwarded; and the
    broker's answer to it: every partition OFFSET_OUT_OF_RANGE."""
    body = fetch_request({t: {p: offsets[t, p] for p in range(PARTITIONS)} for t in TOPICS[:2]},
                         max_bytes=3 * 4096, partition_max_bytes=4096)
    wire.client_sends(ApiKey.FETCH, 12, body)
    [(header, _)] = wire.broker_receives()
    return header, {"throttle_time_ms": 0, "error_code": 0, "session_id": 0, "node_endpoints": [], "responses": [
        {"topic": t, "topic_id": IDS[t], "partitions": [
            partition_entry(p, None, None, None) | {"error_code": ErrorCode.OFFSET_OUT_OF_RANGE}
            for p in range(PARTITIONS)]} for t in TOPICS[:2]]}


def _small_partitions(n: int) -> tuple[AskedTier, list[tuple[str, int]]]:
    """`n` partitions whose tier holds one small segment each (offsets 0..9, about 1 KiB), their leader's log start
    at 500: a consumer of many partitions each with little history."""
    tier = AskedTier()
    small = [(TOPICS[0], p) for p in range(n)]
    for topic, p in small:
        tier.segment(TopicIdPartition(topic, IDS[topic], p), 0, 9, per_batch=10, value_bytes=50)
        tier.leader(topic, p, log_start=500, high_watermark=1000)
    return tier, small


def _read_small(tier: AskedTier, small: list[tuple[str, int]], max_wait_ms: int = 500) -> tuple[int, float]:
    """One fetch of Java's defaults (fetch.max.bytes 50 MiB, max.partition.fetch.bytes 1 MiB) of every partition at
    offset 0, the broker answering all OFFSET_OUT_OF_RANGE: (partitions answered with records, seconds to answer)."""
    async def go() -> tuple[int, float]:
        proxy = InProcessProxy(tier, remote_fetch_max_wait_ms=max_wait_ms)
        wire = Wire(proxy)
        body = fetch_request({TOPICS[0]: {p: 0 for _, p in small}}, max_bytes=50 << 20, partition_max_bytes=1 << 20)
        wire.client_sends(ApiKey.FETCH, 12, body)
        [(header, _)] = wire.broker_receives()
        started = time.monotonic()
        wire.broker_answers(header, {"throttle_time_ms": 0, "error_code": 0, "session_id": 0, "node_endpoints": [],
                                     "responses": [{"topic": TOPICS[0], "topic_id": IDS[TOPICS[0]], "partitions": [
                                         partition_entry(p, None, None, None)
                                         | {"error_code": ErrorCode.OFFSET_OUT_OF_RANGE} for _, p in small]}]})
        await proxy.settle()
        [(_, _, got)] = wire.client_receives()
        assert got is not None
        parts = [p for t in got["responses"] for p in t["partitions"]]
        assert len(parts) == len(small) and all(p["error_code"] == 0 for p in parts)
        return sum(1 for p in parts if list(iter_batches(p["records"]))), time.monotonic() - started

    read, took = run(go())
    return read, took


def test_a_fetch_of_many_small_partitions_reads_them_all_within_its_bytes() -> None:
    """The found case (issue 65, one Java consumer over 10,000 partitions of 22 records each): every read took its
    whole `partition_max_bytes` (1 MiB) of the fetch's 50 MiB before it started, so a fetch read 50 partitions and
    returned ~1 MB, and the consumer needed 200 fetches of all 10,000 partitions. A read stays in one segment: it
    now takes that segment's size, and one fetch reads all 200 small partitions (before: 50)."""
    tier, small = _small_partitions(200)
    read, _ = _read_small(tier, small)
    assert read == len(small), read


def test_a_fetch_reads_what_the_pool_takes_and_leaves_the_rest_without_waiting() -> None:
    """Reads the pool would refuse are left to the next fetch, answered empty at once: not started to be refused
    and then waited for until `remote.fetch.max.wait.ms` (a refusal means other clients fill the pool)."""
    tier, small = _small_partitions(200)
    tier.script.slots = 30
    read, took = _read_small(tier, small, max_wait_ms=3000)
    assert read == 30, read
    assert took < 2.0, took  # well before the purgatory's 3 s deadline
