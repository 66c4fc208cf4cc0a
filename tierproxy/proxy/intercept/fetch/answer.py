"""Building a Fetch answer from the broker's part and the tier's: one remote partition's entry before records
(`partition_entry`) and the merge into exactly the requested partitions, in request order (`merge_response`)."""

from __future__ import annotations

from protocol.messages import FetchResponse, FetchResponseResponse, FetchResponseResponsePartition
from tierproxy.proxy.intercept.fetch.plan import FetchPlan, Key, key_of
from tierproxy.remote.view import BrokerOffsets

Entry = FetchResponseResponsePartition


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


def answered_bytes(upstream: FetchResponse) -> int:
    """Record bytes the broker's part of the answer already holds (counted against the request's budget)."""
    return sum(len(p["records"] or b"") for t in upstream["responses"] for p in t["partitions"]
               if p["error_code"] == 0)


def by_key(plan: FetchPlan, upstream: FetchResponse) -> dict[Key, Entry]:
    """The broker's partition entries by key."""
    return {(t["topic_id"] if plan.by_id else t["topic"], p["partition_index"]): p
            for t in upstream["responses"] for p in t["partitions"]}
