"""Raw record batches from the real broker, exactly as it serves them (READ_UNCOMMITTED, control batches kept)."""

from __future__ import annotations

from typing import Any

from protocol.records import iter_batches
from tierproxy.wireclient import WireClient


def fetch_raw(bootstrap: str, topic: str, partition: int = 0, start: int = 0, end: int | None = None,
              isolation: int = 0) -> tuple[bytes, list[dict[str, Any]]]:
    """All whole batches from `start` up to the high watermark (or `end`), and the aborted txns reported."""
    out = bytearray()
    aborted: list[dict[str, Any]] = []
    offset = start
    with WireClient(bootstrap) as w:
        while True:
            resp = w.request(1, 12, {
                "replica_id": -1, "max_wait_ms": 0, "min_bytes": 0, "max_bytes": 8 << 20, "isolation_level": isolation,
                "session_id": 0, "session_epoch": -1, "topics": [{"topic": topic, "partitions": [
                    {"partition": partition, "fetch_offset": offset, "partition_max_bytes": 8 << 20}]}],
                "forgotten_topics_data": [], "rack_id": ""})
            part = resp["responses"][0]["partitions"][0]
            assert part["error_code"] == 0, part["error_code"]
            aborted += part["aborted_transactions"] or []
            hw = part["high_watermark"] if end is None else min(end, part["high_watermark"])
            batches = list(iter_batches(part["records"]))
            for b in batches:
                if b.last_offset >= offset:
                    out += b.view()
                    offset = b.last_offset + 1
            if offset >= hw or not batches:
                return bytes(out), aborted
