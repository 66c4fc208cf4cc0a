"""Raw record batches from the real broker, exactly as it serves them (READ_UNCOMMITTED, control batches kept)."""

from __future__ import annotations

from typing import Any

from protocol.constants import ApiKey
from protocol.records import iter_batches
from protocol.requests import fetch_request
from tierproxy.kafka.wireclient import WireClient


def fetch_raw(bootstrap: str, topic: str, partition: int = 0, start: int = 0, end: int | None = None,
              isolation: int = 0) -> tuple[bytes, list[dict[str, Any]]]:
    """All whole batches from `start` up to the high watermark (or `end`), and the aborted txns reported."""
    out = bytearray()
    aborted: list[dict[str, Any]] = []
    offset = start
    with WireClient(bootstrap) as w:
        while True:
            resp = w.request(ApiKey.FETCH, 12, fetch_request({topic: {partition: offset}}, max_bytes=8 << 20,
                                                             isolation=isolation))
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
