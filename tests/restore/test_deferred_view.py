"""The proxy's view of a metadata topic defers its segment records until a partition is first read (`tier.cache`;
a background task applies the rest a partition per turn of the loop): through a running proxy in front of the
restored cluster, a partition's segments read as soon as it is ready, then `/v1/topics` and `/metrics` (which apply
whatever is left first), give what a view that applies each record as it comes gives of the same topic."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import httpx
import pytest

from tests.support.proxy import ProxyProcess
from tests.support.restore import PARTITIONS, TOPIC, Disaster
from tests.support.waiting import wait_until
from tierproxy.dev.ports import free_port
from tierproxy.tier.model import uuid_bytes
from tierproxy.tier.rlmm_topic import TopicRLMM

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


def _eager(bootstrap: str, topic_id: bytes) -> tuple[list[list[tuple[int, int, int, str]]], dict[str, list[int]]]:
    """Of a view applying every record as it comes: each partition of TOPIC's segments, and the per-topic sums
    /metrics makes (served segments, bytes, newest copy in ms)."""
    async def go() -> tuple[list[list[tuple[int, int, int, str]]], dict[str, list[int]]]:
        r = TopicRLMM(bootstrap)
        await r.start()
        try:
            assert not r.deferring
            parts = []
            for p in range(PARTITIONS):
                pc = r.cache.get(topic_id, p)
                parts.append([(m.start_offset, m.end_offset, m.segment_size_in_bytes, m.state.name)
                              for m in (pc.all_segments() if pc else [])])
            sums: dict[str, list[int]] = {}
            for pc in r.cache.partitions.values():
                n, size, newest = pc.summary()
                acc = sums.setdefault(pc.tp.topic, [0, 0, 0])
                acc[0], acc[1], acc[2] = acc[0] + n, acc[1] + size, max(acc[2], newest)
            return parts, sums
        finally:
            r.checkpoint_dir = None
            await r.close()

    return asyncio.run(go())


def _gauge(text: str, name: str, topic: str) -> float | None:
    m = re.search(rf'^{name}{{topic="{re.escape(topic)}"}} ([0-9.e+]+)$', text, re.M)
    return float(m.group(1)) if m else None


def test_a_partition_read_first_and_the_figures_are_those_of_a_view_applying_every_record(
        disaster: Disaster, tmp_path: Path) -> None:
    port = free_port()
    p = ProxyProcess(disaster.b.bootstrap, tmp_path, extra={
        "TIERPROXY_STORAGE": f"file://{disaster.tier}", "TIERPROXY_METADATA": "topic:",
        "TIERPROXY_ADMIN_LISTEN": f"127.0.0.1:{port}"})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: httpx.get(url + "/readyz", timeout=5).status_code == 200, "the proxy's tier loaded")
        with httpx.Client(base_url=url, timeout=60) as c:
            first = [(s["start_offset"], s["end_offset"], s["size_bytes"], s["state"])
                     for s in c.get(f"/v1/topics/{TOPIC}/partitions/1/segments").json()]
            topics = {t["topic"]: t for t in c.get("/v1/topics").json()}
            metrics = c.get("/metrics").text
            then = [[(s["start_offset"], s["end_offset"], s["size_bytes"], s["state"])
                     for s in c.get(f"/v1/topics/{TOPIC}/partitions/{q}/segments").json()] for q in range(PARTITIONS)]
        parts, sums = _eager(disaster.b.bootstrap, uuid_bytes(topics[TOPIC]["topic_id"]))
        assert first and first == parts[1], "the partition read first: what the eager view holds"
        assert then == parts
        served = sum(1 for q in range(PARTITIONS) for s in parts[q] if s[3] == "COPY_SEGMENT_FINISHED")
        assert topics[TOPIC]["tiered_segments"] == served > 0
        for topic, (n, size, newest) in sums.items():
            assert _gauge(metrics, "tierproxy_tier_segments", topic) == n, topic
            assert _gauge(metrics, "tierproxy_tier_bytes", topic) == size, topic
            if newest:
                assert _gauge(metrics, "tierproxy_tier_last_copy_timestamp_seconds", topic) == newest / 1000
        assert re.search(r"^tierproxy_rlmm_records_skipped_total 0\.0$", metrics, re.M)
    finally:
        p.stop()
