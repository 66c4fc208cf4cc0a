"""Request bodies tierproxy sends on its own behalf, built in one place (the codec's dicts, by topic name).

    fetch_request        => Fetch v4-12: replica_id -1 (a consumer), no fetch session (session_id 0, epoch -1),
                            one entry per (topic, partition) with its fetch_offset and partition_max_bytes
    list_offsets_request => ListOffsets v1-10: replica_id -1, one timestamp (or OffsetSpec) per partition
    PARTITION_BOUNDS     => the three ListOffsets that give log start, last stable offset and high watermark
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from protocol.constants import ErrorCode, IsolationLevel, OffsetSpec

Data = dict[str, Any]


def fetch_request(offsets: Mapping[str, Mapping[int, int]], *, max_bytes: int, partition_max_bytes: int | None = None,
                  max_wait_ms: int = 0, min_bytes: int = 0, isolation: int = IsolationLevel.READ_UNCOMMITTED,
                  topic_ids: Mapping[str, bytes] | None = None) -> Data:
    """A sessionless consumer Fetch of `offsets` ({topic: {partition: fetch_offset}}); each partition may return
    up to `partition_max_bytes` (default: `max_bytes`). `topic_ids` name the topics by id (Fetch v13+)."""
    per_partition = max_bytes if partition_max_bytes is None else partition_max_bytes
    ids = topic_ids or {}
    return {"replica_id": -1, "max_wait_ms": max_wait_ms, "min_bytes": min_bytes, "max_bytes": max_bytes,
            "isolation_level": int(isolation), "session_id": 0, "session_epoch": -1,
            "topics": [{"topic": topic, "topic_id": ids.get(topic, bytes(16)), "partitions": [
                {"partition": p, "fetch_offset": o, "partition_max_bytes": per_partition} for p, o in parts.items()]}
                for topic, parts in offsets.items()],
            "forgotten_topics_data": [], "rack_id": ""}


def list_offsets_request(timestamps: Mapping[str, Mapping[int, int]], *,
                         isolation: int = IsolationLevel.READ_UNCOMMITTED, timeout_ms: int = 0) -> Data:
    """ListOffsets for {topic: {partition: timestamp or OffsetSpec}}; `timeout_ms` goes on the wire from v10."""
    return {"replica_id": -1, "isolation_level": int(isolation), "timeout_ms": timeout_ms,
            "topics": [{"name": topic, "partitions": [
                {"partition_index": p, "current_leader_epoch": -1, "timestamp": int(ts)} for p, ts in parts.items()]}
                for topic, parts in timestamps.items()]}


# A partition's bounds take three ListOffsets: (name, isolation level, spec).
PARTITION_BOUNDS = (("log_start", IsolationLevel.READ_UNCOMMITTED, OffsetSpec.EARLIEST),
                    ("last_stable", IsolationLevel.READ_COMMITTED, OffsetSpec.LATEST),
                    ("high_watermark", IsolationLevel.READ_UNCOMMITTED, OffsetSpec.LATEST))


def listed_offsets(response: Data) -> dict[tuple[str, int], int]:
    """{(topic, partition): offset} of a ListOffsets response, for the partitions answered without error."""
    return {(t["name"], p["partition_index"]): p["offset"]
            for t in response["topics"] for p in t["partitions"] if p["error_code"] == ErrorCode.NONE}
