"""Filling a new partition up to S with null records and purging them as it goes, through the protocol alone.

A broker assigns offsets itself, so the only way to begin a partition at S is to write S records and delete them
(DeleteRecords moves the log start): each Produce carries one gzip batch of `restore.fill.batch.records` null
records (a template, built once per size), acks=all, one request in flight per partition.

The fill can never pass S, by construction. It writes as an idempotent producer (InitProducerId; each batch with
the producer's id, epoch and base sequence): a Produce that failed (REQUEST_TIMED_OUT, NOT_ENOUGH_REPLICAS_AFTER_APPEND,
a socket timeout) may still have been appended, so it is sent again unchanged, and a batch the leader already holds
is answered as a duplicate, never appended twice. The end it writes from is the leader's log end (OffsetForLeaderEpoch
of the current epoch), never the high watermark, which trails a batch appended but not yet replicated: a rerun
after kill -9 (a new producer) begins at the true end. The filler is purged after every batch, so the broker never
holds more than one batch of it, whatever S is; the partition ends at log start = high watermark = S.
"""

from __future__ import annotations

import functools
import logging
import struct
import time
from dataclasses import dataclass
from typing import Any, Protocol

import crc32c

from protocol import compression
from protocol.constants import ApiKey, OffsetSpec
from protocol.records import ATTRIBUTES_OFFSET, CRC_OFFSET, Record, build_batch, iter_batches
from protocol.requests import fetch_request, list_offsets_request
from tierproxy.config.identity import ClientIdentity
from tierproxy.kafka.wireclient import WireClient

log = logging.getLogger("tierproxy.jobs.restore")
MAX_ATTEMPTS = 10
TOO_LARGE = {10, 18}  # MESSAGE_TOO_LARGE, RECORD_LIST_TOO_LARGE
NOT_LEADER = 6  # NOT_LEADER_OR_FOLLOWER: not written; the caller asks the leader again (`restore.run`)
DUPLICATE_SEQUENCE = 46  # an older broker's answer to a batch it already holds: written
MAX_SEQUENCE = 2**31 - 1
# batch header fields patched per batch (protocol.records.BATCH_HEADER)
PRODUCER_FIELDS = struct.Struct(">qhi")  # producer_id:int64 producer_epoch:int16 base_sequence:int32
PRODUCER_OFFSET = 43


def fill_configs(configs: dict[str, str]) -> dict[str, str]:
    """The configs a topic is created with for its fill: its own, but `cleanup.policy=delete` for a compacted one —
    a compacted topic refuses the filler's records (they have no key) and, under `compact` alone, DeleteRecords
    (POLICY_VIOLATION). Its own policy is set once the fill is verified (`restore.run`)."""
    if "compact" in configs.get("cleanup.policy", "delete"):
        return {**configs, "cleanup.policy": "delete"}
    return dict(configs)


class FillFailed(RuntimeError):
    """A partition could not be filled to S (the broker kept refusing, or its end passed S)."""


class ForeignRecords(FillFailed):
    """Something else wrote to the partition being filled: a fill goes no further (its purge would delete those
    records) and is not retried; nothing of theirs is deleted."""


@dataclass(frozen=True)
class FillResult:
    topic: str
    partition: int
    start: int
    filled: int  # offsets written by this run
    seconds: float
    resent: int = 0  # requests sent again after an error or no answer (a Produce: a duplicate, or appended once)


@functools.lru_cache(maxsize=8)
def template(count: int) -> bytes:
    """One batch of `count` null records (no key, no value, no headers), gzip-compressed."""
    now = int(time.time() * 1000)
    return build_batch([Record(i, now, None, None) for i in range(count)], codec=compression.GZIP,
                       partition_leader_epoch=-1)


def idempotent_batch(count: int, producer_id: int, producer_epoch: int, base_sequence: int) -> bytes:
    """`template(count)` as a batch of an idempotent producer: its id, epoch and base sequence, the CRC again."""
    out = bytearray(template(count))
    PRODUCER_FIELDS.pack_into(out, PRODUCER_OFFSET, producer_id, producer_epoch, base_sequence)
    struct.pack_into(">I", out, CRC_OFFSET, crc32c.crc32c(memoryview(out)[ATTRIBUTES_OFFSET:]))
    return bytes(out)


class Requester(Protocol):
    def request(self, api_key: int, version: int, body: dict[str, Any]) -> dict[str, Any]: ...


class Leader:
    """The partition leader's connection for the fill. Every request of the fill may be sent twice: a Produce
    carries its producer's sequence (a batch the leader holds is answered as a duplicate), the others read or
    purge (idempotent). So one that gets no answer (a socket timeout, a lost connection), whether the leader
    acted on it or not, is sent again on a new connection: up to MAX_ATTEMPTS times within max(30 s, twice the
    socket timeout) of the first failure (a leader that stays silent longer is left to the caller, which asks
    for the partition's leader again)."""

    def __init__(self, address: str, identity: ClientIdentity | None, wait: float) -> None:
        self.address, self.identity, self.wait = address, identity, wait
        self.resent = 0
        self.w = self._connect()

    def _connect(self) -> WireClient:
        return WireClient(self.address, client_id="tierproxy-restore", timeout=self.wait, identity=self.identity)

    def request(self, api_key: int, version: int, body: dict[str, Any]) -> dict[str, Any]:
        first_failure: float | None = None
        for attempt in range(1, MAX_ATTEMPTS + 1):
            try:
                return self.w.request(api_key, version, body)
            except OSError as exc:
                first_failure = time.monotonic() if first_failure is None else first_failure
                if attempt == MAX_ATTEMPTS or time.monotonic() - first_failure > max(30.0, 2 * self.wait):
                    raise
                self.resent += 1
                self.w.close()
                log.info("%s: no answer to API %d (%s): sent again on a new connection", self.address, api_key, exc)
                time.sleep(min(0.1 * 2 ** attempt, 2.0))
                self.w = self._connect()
        raise AssertionError("unreachable")

    def close(self) -> None:
        self.w.close()


def offsets(w: Requester, topic: str, partition: int) -> tuple[int, int, int]:
    """(log start, high watermark, leader epoch) as the leader answers now."""
    got = []
    for spec in (OffsetSpec.EARLIEST, OffsetSpec.LATEST):
        resp = w.request(ApiKey.LIST_OFFSETS, 7, list_offsets_request({topic: {partition: spec}}))
        p = resp["topics"][0]["partitions"][0]
        if p["error_code"]:
            raise FillFailed(f"{topic}-{partition}: ListOffsets answered {p['error_code']}")
        got.append(p)
    return got[0]["offset"], got[1]["offset"], got[1]["leader_epoch"]


def log_end(w: Requester, topic: str, partition: int, epoch: int) -> int:
    """The leader's log end offset: what it holds, replicated or not (OffsetForLeaderEpoch of its current epoch
    answers the log end; the high watermark may trail it)."""
    resp = w.request(ApiKey.OFFSET_FOR_LEADER_EPOCH, 4, {"replica_id": -1, "topics": [{"topic": topic, "partitions": [
        {"partition": partition, "current_leader_epoch": epoch, "leader_epoch": epoch}]}]})
    p = resp["topics"][0]["partitions"][0]
    if p["error_code"] or p["end_offset"] < 0:
        raise FillFailed(f"{topic}-{partition}: OffsetForLeaderEpoch({epoch}) answered error {p['error_code']}, "
                         f"end {p['end_offset']}")
    return int(p["end_offset"])


def init_producer(w: Requester) -> tuple[int, int]:
    """A new idempotent producer's (id, epoch)."""
    for attempt in range(MAX_ATTEMPTS):
        resp = w.request(ApiKey.INIT_PRODUCER_ID, 4, {"transactional_id": None, "transaction_timeout_ms": 60_000})
        if not resp["error_code"]:
            return int(resp["producer_id"]), int(resp["producer_epoch"])
        time.sleep(min(0.1 * 2 ** attempt, 2.0))
    raise FillFailed(f"InitProducerId answered error {resp['error_code']} {MAX_ATTEMPTS} times (the fill writes as "
                     "an idempotent producer: WRITE on the topic, or IDEMPOTENT_WRITE on the cluster)")


def fill_partition(leader: str, topic: str, partition: int, start: int, batch_records: int,
                   identity: ClientIdentity | None, timeout_ms: int = 30_000,
                   socket_timeout: float | None = None) -> FillResult:
    """Fill `topic`-`partition` (at its leader) until its log start and high watermark are both `start`.
    `timeout_ms`: each Produce's own timeout (acks=all); `socket_timeout`: how long an answer is waited for
    (default: twice that, at least 60 s)."""
    began = time.monotonic()
    filled = attempts = resent = 0
    w = Leader(leader, identity, socket_timeout if socket_timeout is not None else max(60, 2 * timeout_ms / 1000))
    try:
        log_start, _, epoch = offsets(w, topic, partition)
        end = log_end(w, topic, partition, epoch)  # a batch appended but not replicated counts: never under it
        if log_start < end and (why := _not_filler(w, topic, partition, log_start, end)):
            raise ForeignRecords(f"{topic}-{partition} holds records the fill did not write ({why}): refusing to "
                                 "purge them; stop whatever writes to it (a restored topic's producers wait for "
                                 "its stage), then delete the topic in the new cluster or keep it out (--topics)")
        producer_id, producer_epoch = init_producer(w)
        sequence = 0
        budget = (start - end) + MAX_ATTEMPTS + 40  # a bounded loop: at worst one offset per request
        for _ in range(max(budget, MAX_ATTEMPTS)):
            if end > start:
                raise ForeignRecords(f"{topic}-{partition} ends at {end}, past {start}: something else writes to it")
            if end == start:
                break
            n = min(batch_records, start - end)
            if sequence + n > MAX_SEQUENCE:  # (S above 2^31 offsets) a new producer begins its sequence at 0
                (producer_id, producer_epoch), sequence = init_producer(w), 0
            batch = idempotent_batch(n, producer_id, producer_epoch, sequence)
            resp = w.request(ApiKey.PRODUCE, 9, {"transactional_id": None, "acks": -1, "timeout_ms": timeout_ms,
                                                 "topic_data": [{"name": topic, "partition_data": [
                                                     {"index": partition, "records": batch}]}]})
            answer = resp["responses"][0]["partition_responses"][0]
            err = answer["error_code"]
            if err in TOO_LARGE and batch_records > 1:  # the topic's max.message.bytes: smaller batches
                batch_records = max(1, batch_records // 4)
                continue
            if err == NOT_LEADER:
                raise FillFailed(f"{topic}-{partition}: {leader} is no longer its leader")
            if err and err != DUPLICATE_SEQUENCE:
                # the same batch again (same sequence): appended already, the leader answers it as a duplicate
                attempts += 1
                resent += 1
                if attempts >= MAX_ATTEMPTS:
                    raise FillFailed(f"{topic}-{partition}: Produce answered error {err} {attempts} times")
                time.sleep(min(0.1 * 2 ** attempts, 2.0))
                continue
            if err == 0 and answer["base_offset"] != end:  # not purged: the records below it are someone's
                raise ForeignRecords(f"{topic}-{partition}: filler written at {answer['base_offset']}, expected "
                                     f"{end}: something else writes to it; nothing purged past {end}")
            attempts = 0
            filled += n
            end += n
            sequence += n
            _purge(w, topic, partition, end)  # at most one batch of filler on the broker's disk
            log_start = end
        else:
            raise FillFailed(f"{topic}-{partition}: not filled to {start} within its bound of requests")
        log_start, high_watermark = _replicated(w, topic, partition, start)
        if log_start < start:
            _purge(w, topic, partition, start)
        log_start, high_watermark, _ = offsets(w, topic, partition)
    finally:
        w.close()
    if (log_start, high_watermark) != (start, start):
        raise FillFailed(f"{topic}-{partition}: log start {log_start}, end {high_watermark} after the fill; "
                         f"expected {start}")
    return FillResult(topic, partition, start, filled, time.monotonic() - began, resent + w.resent)


def _not_filler(w: Requester, topic: str, partition: int, start: int, end: int) -> str | None:
    """Why [start, end) holds something other than filler (null records a fill wrote and was killed before it
    purged them: at most a batch or two), or None. Read whole before any purge: a client's record is never purged."""
    offset = start
    for _ in range(64):  # bounded: a few batches of filler at most
        if offset >= end:
            return None
        resp = w.request(ApiKey.FETCH, 12, fetch_request({topic: {partition: offset}}, max_bytes=8 << 20))
        part = resp["responses"][0]["partitions"][0]
        if part["error_code"]:
            return f"Fetch at {offset} answered error {part['error_code']}"
        batches = [b for b in iter_batches(part["records"]) if b.base_offset < end]
        if not batches:
            return f"nothing could be read at {offset}"
        for b in batches:
            if b.is_control or b.is_transactional or any(
                    r.key is not None or r.value is not None or r.headers for r in b.records()):
                return f"the batch at {b.base_offset} holds records other than null ones"
            offset = b.last_offset + 1
    return f"more than 64 batches below {end}"


def _replicated(w: Requester, topic: str, partition: int, start: int) -> tuple[int, int]:
    """(log start, high watermark) once the high watermark has reached `start` (a rerun that found the log end
    there may see a tail not replicated yet), within 30 s."""
    deadline = time.monotonic() + 30
    delay = 0.05
    while True:
        log_start, high_watermark, _ = offsets(w, topic, partition)
        if high_watermark >= start or time.monotonic() >= deadline:
            return log_start, high_watermark
        time.sleep(delay)
        delay = min(delay * 2, 1.0)


def _purge(w: Requester, topic: str, partition: int, offset: int) -> None:
    """DeleteRecords below `offset`, asked again (it is idempotent) while the leader answers an error."""
    for attempt in range(1, MAX_ATTEMPTS + 1):
        resp = w.request(ApiKey.DELETE_RECORDS, 2, {"topics": [{"name": topic, "partitions": [
            {"partition_index": partition, "offset": offset}]}], "timeout_ms": 30_000})
        err = resp["topics"][0]["partitions"][0]["error_code"]
        if not err:
            return
        if err == NOT_LEADER or attempt == MAX_ATTEMPTS:
            raise FillFailed(f"{topic}-{partition}: DeleteRecords({offset}) answered error {err} {attempt} times")
        time.sleep(min(0.1 * 2 ** attempt, 2.0))
