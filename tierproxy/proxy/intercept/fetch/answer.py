"""Building a Fetch answer from the broker's part and the tier's: one remote partition's entry before records
(`partition_entry`) and the merge into exactly the requested partitions, in request order (`merge_response`).

The broker's part of a forwarded fetch stays its bytes (`BrokerPart`): the answer replaces the entries of the
partitions the tier answers and copies the rest (`Spliced`), so its cost follows the partitions the tier answers,
not the partitions the fetch names (a consumer of 10,000 partitions names every one in every sessionless fetch).
An answer made without the broker, or while the tier loads, is built from a decoded response (`merge_response`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

from protocol.apis.fetch_scan import FetchScan
from protocol.apis.fetch_splice import decode_entry, splice_response, throttle_of
from protocol.connection import ResponseEvent
from protocol.messages import FetchResponse, FetchResponseResponse, FetchResponseResponsePartition
from protocol.primitives import Chunk
from tierproxy.proxy.intercept.fetch.plan import FetchPlan, Key, key_of
from tierproxy.remote.view import BrokerOffsets

Entry = FetchResponseResponsePartition


class BrokerPart:
    """The broker's answer to a forwarded Fetch as it came (no NodeEndpoints to rewrite), with its scan: where each
    erring partition's entry lies, and the record bytes the broker answered."""

    def __init__(self, ev: ResponseEvent, scan: FetchScan) -> None:
        self.frame, self.version, self.body_offset = ev.frame, ev.api_version, ev.body_offset
        self.answered = scan.answered
        self.spans = {(e.topic, e.partition): span for e, span in zip(scan.errors, scan.spans, strict=True)}

    def entry(self, key: Key) -> Entry | None:
        """The broker's entry of an erring partition, decoded only if it has tagged fields (the one part of it a
        remote entry keeps: those this codec does not know)."""
        span = self.spans.get(key)
        if span is None or not span[2]:
            return None
        return cast(Entry, decode_entry(self.frame, self.version, (span[0], span[1])))


@dataclass
class Spliced:
    """A remote answer as the broker's bytes with `entries` (erring partitions of the broker's part) replaced."""

    part: BrokerPart
    entries: dict[Key, Entry]
    throttle_ms: int  # a spent remote fetch quota's (0: the broker's own stands)

    def chunks(self, correlation_id: int) -> list[Chunk]:
        part = self.part
        spans = sorted(((part.spans[k][:2], e) for k, e in self.entries.items()), key=lambda x: x[0])
        throttle = max(throttle_of(part.frame, part.body_offset), self.throttle_ms) if self.throttle_ms else None
        return splice_response(part.frame, part.version, part.body_offset, correlation_id, spans, throttle)


Answer = FetchResponse | Spliced


def partition_entry(partition: int, broker_entry: Entry | None, broker: BrokerOffsets | None,
                    tier_start: int | None) -> Entry:
    """A remote partition's response entry before records: the leader's HW and LSO (-1 when it could not be asked:
    the entry then carries an error, never records), the tier's start as log start. Of the broker's entry only
    tagged fields this codec does not know are kept."""
    hw = broker.high_watermark if broker is not None else -1
    lso = broker.last_stable if broker is not None and broker.last_stable >= 0 else hw
    entry: Entry = {"partition_index": partition, "error_code": 0, "high_watermark": hw, "last_stable_offset": lso,
                    "log_start_offset": tier_start if tier_start is not None else -1, "diverging_epoch": None,
                    "current_leader": None, "snapshot_id": None, "aborted_transactions": None,
                    "preferred_read_replica": -1, "records": memoryview(b"")}
    if broker_entry is not None and "_unknown" in broker_entry:
        entry["_unknown"] = broker_entry["_unknown"]
    return entry


def merge_response(plan: FetchPlan, broker: FetchResponse | None, entries: dict[Key, Entry]) -> FetchResponse:
    """Exactly the requested partitions, in request order (the Java client drops anything else)."""
    topics: list[FetchResponseResponse] = []
    for t in plan.request["topics"]:
        parts = [entries[k] for p in t["partitions"] if (k := key_of(plan.by_id, t, p)) in entries]
        topics.append({"topic": t["topic"], "topic_id": t["topic_id"], "partitions": parts})
    if broker is None:
        return {"throttle_time_ms": 0, "error_code": 0, "session_id": 0, "responses": topics, "node_endpoints": []}
    base = broker.copy()
    base.update({"session_id": 0, "responses": topics})
    return base


def answer_of(plan: FetchPlan, upstream: FetchResponse | BrokerPart, entries: dict[Key, Entry],
              throttle_ms: int) -> Answer:
    """The answer: the broker's part with `entries` in place of its own (spliced into its bytes, or merged)."""
    if isinstance(upstream, BrokerPart):
        return Spliced(upstream, entries, throttle_ms)
    merged = by_key(plan, upstream)
    merged.update(entries)
    response = merge_response(plan, upstream, merged)
    if throttle_ms:  # a spent remote fetch quota: the client waits before asking again (KIP-219)
        response["throttle_time_ms"] = max(response["throttle_time_ms"], throttle_ms)
    return response


def broker_entries(plan: FetchPlan, upstream: FetchResponse | BrokerPart) -> Callable[[Key], Entry | None]:
    """The broker's entry of a partition, by key."""
    if isinstance(upstream, BrokerPart):
        return upstream.entry
    return by_key(plan, upstream).get


def answered_bytes(upstream: FetchResponse | BrokerPart) -> int:
    """Record bytes the broker's part of the answer already holds (counted against the request's budget)."""
    if isinstance(upstream, BrokerPart):
        return upstream.answered
    return sum(len(p["records"] or b"") for t in upstream["responses"] for p in t["partitions"]
               if p["error_code"] == 0)


def by_key(plan: FetchPlan, upstream: FetchResponse) -> dict[Key, Entry]:
    """The broker's partition entries by key."""
    return {(t["topic_id"] if plan.by_id else t["topic"], p["partition_index"]): p
            for t in upstream["responses"] for p in t["partitions"]}
