"""The brokers' live range for the DataFrame reader: raw batches fetched from the partition leader with the
`protocol` package (the same path the tiering job copies with), and ListOffsets by timestamp."""

from __future__ import annotations

from collections.abc import Iterator

from protocol.constants import ApiKey, ErrorCode, IsolationLevel, OffsetSpec
from protocol.records import RecordBatch
from protocol.requests import fetch_request, list_offsets_request
from tierproxy.jobs.tiering.copy import iter_fetch
from tierproxy.kafka.wireclient import WireClient


def live_batches(leader: str, topic: str, partition: int, start: int, end: int, read_committed: bool,
                 aborted: list[tuple[int, int]]) -> Iterator[RecordBatch]:
    """Batches covering [start, end) from the leader; the aborted transactions the broker reports are appended to
    `aborted` as they arrive (before the batches they concern are yielded)."""
    isolation = IsolationLevel.READ_COMMITTED if read_committed else IsolationLevel.READ_UNCOMMITTED
    for batches, txns in iter_fetch(leader, topic, partition, start, end, client_id="tierproxy-spark",
                                    isolation=isolation):
        aborted += txns
        yield from batches


def live_offset_for_time(leader: str, topic: str, partition: int, ts: int) -> int | None:
    """The broker's first offset with timestamp ≥ ts (ListOffsets v7), None when there is none."""
    with WireClient(leader, client_id="tierproxy-spark") as w:
        resp = w.request(ApiKey.LIST_OFFSETS, 7, list_offsets_request({topic: {partition: ts}}))
    p = resp["topics"][0]["partitions"][0]
    if p["error_code"] != 0:
        raise RuntimeError(f"ListOffsets by timestamp for {topic}-{partition}: error {p['error_code']}")
    return int(p["offset"]) if p["offset"] >= 0 else None


def live_aborted_reaching(leader: str, topic: str, partition: int, log_start: int) -> list[tuple[int, int]]:
    """(producer id, first offset) of the aborted transactions that reach the leader's log start from below: a
    READ_COMMITTED Fetch there lists them. A transaction open at the tier's end (the tier copies to the LSO) may
    have its ABORT marker only in the broker's log. Retention may move the log start after the plan read it: the
    Fetch is then asked again at the log start the leader reports (a few times at most)."""
    with WireClient(leader, client_id="tierproxy-spark") as w:
        for _ in range(5):
            resp = w.request(ApiKey.FETCH, 12, fetch_request({topic: {partition: log_start}}, max_bytes=1,
                                                             isolation=IsolationLevel.READ_COMMITTED))
            p = resp["responses"][0]["partitions"][0]
            if p["error_code"] != ErrorCode.OFFSET_OUT_OF_RANGE:
                break
            earliest = w.request(ApiKey.LIST_OFFSETS, 7, list_offsets_request(
                {topic: {partition: OffsetSpec.EARLIEST}}))["topics"][0]["partitions"][0]
            if earliest["error_code"] != 0 or earliest["offset"] <= log_start:
                break  # not a log start that moved on: the error stands
            log_start = int(earliest["offset"])
    if p["error_code"] != 0:
        raise RuntimeError(f"aborted transactions at {topic}-{partition}'s log start: error {p['error_code']}")
    return [(a["producer_id"], a["first_offset"]) for a in p["aborted_transactions"] or () if
            a["first_offset"] < log_start]
