"""Filling a new partition up to S with null records and purging them as it goes, through the protocol alone.

A broker assigns offsets itself, so the only way to begin a partition at S is to write S records and delete them
(DeleteRecords moves the log start): each Produce carries one gzip batch of `restore.fill.batch.records` null
records (a template, built once per size), acks=all, one request in flight per partition. Before any retry the
partition's end is asked again (ListOffsets), so a Produce that timed out but was written is never written twice:
the fill can never pass S. The filler is purged after every batch, so the broker never holds more than one
batch of it, whatever S is; the partition ends at log start = high watermark = S. Killed at any point, a rerun
goes on from the partition's end.
"""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass

from protocol import compression
from protocol.constants import ApiKey, OffsetSpec
from protocol.records import Record, build_batch
from protocol.requests import list_offsets_request, listed_offsets
from tierproxy.config.identity import ClientIdentity
from tierproxy.kafka.wireclient import WireClient

log = logging.getLogger("tierproxy.jobs.restore")
MAX_ATTEMPTS = 10
TOO_LARGE = {10, 18}  # MESSAGE_TOO_LARGE, RECORD_LIST_TOO_LARGE


class FillFailed(RuntimeError):
    """A partition could not be filled to S (the broker kept refusing, or its end passed S)."""


@dataclass(frozen=True)
class FillResult:
    topic: str
    partition: int
    start: int
    filled: int  # offsets written by this run
    seconds: float


@functools.lru_cache(maxsize=8)
def template(count: int) -> bytes:
    """One batch of `count` null records (no key, no value, no headers), gzip-compressed."""
    now = int(time.time() * 1000)
    return build_batch([Record(i, now, None, None) for i in range(count)], codec=compression.GZIP,
                       partition_leader_epoch=-1)


def offsets(w: WireClient, topic: str, partition: int) -> tuple[int, int]:
    """(log start, high watermark) as the leader answers now."""
    got = []
    for spec in (OffsetSpec.EARLIEST, OffsetSpec.LATEST):
        resp = w.request(ApiKey.LIST_OFFSETS, 7, list_offsets_request({topic: {partition: spec}}))
        found = listed_offsets(resp)
        if (topic, partition) not in found:
            raise FillFailed(f"{topic}-{partition}: ListOffsets answered "
                             f"{resp['topics'][0]['partitions'][0]['error_code']}")
        got.append(found[(topic, partition)])
    return got[0], got[1]


def fill_partition(leader: str, topic: str, partition: int, start: int, batch_records: int,
                   identity: ClientIdentity | None) -> FillResult:
    """Fill `topic`-`partition` (at its leader) until its log start and high watermark are both `start`."""
    began = time.monotonic()
    filled = attempts = 0
    with WireClient(leader, client_id="tierproxy-restore", timeout=60, identity=identity) as w:
        log_start, end = offsets(w, topic, partition)
        budget = (start - end) + MAX_ATTEMPTS + 40  # a bounded loop: at worst one offset per request
        for _ in range(max(budget, MAX_ATTEMPTS)):
            if end > start:
                raise FillFailed(f"{topic}-{partition} ends at {end}, past {start}: something else writes to it")
            if end == start:
                break
            n = min(batch_records, start - end)
            resp = w.request(ApiKey.PRODUCE, 9, {"transactional_id": None, "acks": -1, "timeout_ms": 30_000,
                                                 "topic_data": [{"name": topic, "partition_data": [
                                                     {"index": partition, "records": template(n)}]}]})
            err = resp["responses"][0]["partition_responses"][0]["error_code"]
            if err in TOO_LARGE and batch_records > 1:  # the topic's max.message.bytes: smaller batches
                batch_records = max(1, batch_records // 4)
                continue
            if err:
                attempts += 1
                if attempts >= MAX_ATTEMPTS:
                    raise FillFailed(f"{topic}-{partition}: Produce answered error {err} {attempts} times")
                time.sleep(min(0.1 * 2 ** attempts, 2.0))
                log_start, end = offsets(w, topic, partition)  # before a retry: never past S
                continue
            filled += n
            end += n
            _purge(w, topic, partition, end)  # at most one batch of filler on the broker's disk
            log_start = end
        else:
            raise FillFailed(f"{topic}-{partition}: not filled to {start} within its bound of requests")
        if log_start < start:
            _purge(w, topic, partition, start)
        log_start, end = offsets(w, topic, partition)
    if (log_start, end) != (start, start):
        raise FillFailed(f"{topic}-{partition}: log start {log_start}, end {end} after the fill; expected {start}")
    return FillResult(topic, partition, start, filled, time.monotonic() - began)


def _purge(w: WireClient, topic: str, partition: int, offset: int) -> None:
    resp = w.request(ApiKey.DELETE_RECORDS, 2, {"topics": [{"name": topic, "partitions": [
        {"partition_index": partition, "offset": offset}]}], "timeout_ms": 30_000})
    err = resp["topics"][0]["partitions"][0]["error_code"]
    if err:
        raise FillFailed(f"{topic}-{partition}: DeleteRecords({offset}) answered error {err}")
