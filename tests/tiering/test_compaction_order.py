"""A tier compaction's groups are replaced in offset order, stopping at the first one that is not (Kafka's
`Cleaner.clean` replaces its groups in order and stops at the first failure): a later group's cleaning may have
removed a tombstone whose key's older value only the earlier group's cleaning removed."""

from __future__ import annotations

import asyncio
import itertools
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from protocol.records import DELETE_HORIZON_BIT, iter_batches
from tests.support.compacted import raw_batches
from tests.support.kafka import create_topic, small_segment_producer, small_segments
from tests.support.replacing import compact
from tests.support.tiering import settings, tier_once, tiered
from tests.support.waiting import wait_until
from tierproxy.config import TierSettings
from tierproxy.dev.kafkadist import KafkaCluster
from tierproxy.jobs.tiering.pauses import TIER_PAUSE_AT
from tierproxy.jobs.tiering.replace import joined, replace_group
from tierproxy.tier.open import open_metadata
from tierproxy.tier.rsm import RemoteStorageManager

pytestmark = [pytest.mark.kafka, pytest.mark.spark]
DEAD = b"the-deleted-key"
# the broker's cleaner sets the tombstone's delete horizon (KIP-534) at its first cleaning, 2 s on: time for the tier
# to copy it before a later cleaning of the broker's removes it, then for the tier's cleaning to remove it
CONFIGS = {**small_segments(16 * 1024), "cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01",
           "min.compaction.lag.ms": "0", "delete.retention.ms": "2000"}


def _fill(bootstrap: str, topic: str, prefix: str, n: int) -> dict[bytes, bytes | None]:
    p = small_segment_producer(bootstrap)
    out: dict[bytes, bytes | None] = {}
    for i in range(n):
        key, value = f"{prefix}-{i}".encode(), f"{prefix}-value-{i}-".encode() * 6
        p.produce(topic, value, key)
        out[key] = value
    p.flush(60)
    return out


def _rewrite_first_segment(s: TierSettings, topic: str) -> None:
    """Another replacement of the first tier segment meanwhile (its very bytes, through a second metadata view):
    the compaction's group 0 is then no longer wholly served, and its finish rolls back."""
    async def run() -> None:
        rlmm = open_metadata(s.metadata, "")
        await rlmm.start()
        rsm = RemoteStorageManager.from_uri(s.storage)
        try:
            pc = rlmm.cache.find(topic, 0)
            assert pc is not None
            first = [next(pc.finished())]
            assert await replace_group(rlmm, rsm, first, await joined(rsm, first)) is not None
        finally:
            await rsm.close()
            await rlmm.close()

    asyncio.run(run())


def test_a_group_not_replaced_stops_the_later_groups(kafka: KafkaCluster, tmp_path: Path, topic_name: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    create_topic(kafka.bootstrap, topic_name, config=CONFIGS)
    p = small_segment_producer(kafka.bootstrap)
    p.produce(topic_name, b"its-old-value", DEAD)  # offset 0: the tier's first segment
    p.flush(30)
    latest = _fill(kafka.bootstrap, topic_name, "a", 1500)
    s = settings(kafka.bootstrap, tmp_path, topic_name, tier_cleaner_enable=False, tier_orphan_timeout_ms=0,
                 tier_segment_delete_delay_ms=0)
    tier_once(s)  # the old value in the tier (the tier's own cleaner off: the step below is the only cleaning)
    p.produce(topic_name, None, DEAD)
    p.flush(30)
    latest.update(_fill(kafka.bootstrap, topic_name, "b", 1500))

    def horizon_set() -> bool:
        return any(b.header().attributes & DELETE_HORIZON_BIT and any(r.key == DEAD for r in b.records())
                   for b in raw_batches(kafka.bootstrap, topic_name))

    wait_until(horizon_set, "the broker's cleaner sets the tombstone's delete horizon", timeout=60, interval=0.2)
    tier_once(s)  # the tombstone, its horizon set, copied into a later tier segment
    segs, raw, _ = tiered(s, topic_name)
    dead = [(md.start_offset, b.header().attributes & DELETE_HORIZON_BIT, b.base_timestamp) for md in segs
            for b in iter_batches(raw)
            if md.start_offset <= b.base_offset <= md.end_offset and any(r.key == DEAD for r in b.records())]
    assert dead[0][:2] == (0, 0) and dead[-1][0] > segs[0].end_offset and dead[-1][1], dead
    horizon = dead[-1][2]
    wait_until(lambda: time.time() * 1000 > horizon, "the tombstone's delete horizon passes", timeout=10)

    began = time.monotonic()
    marker, resume = tmp_path / "paused", tmp_path / "resume"
    monkeypatch.setenv(TIER_PAUSE_AT, f"started:{marker}:{resume}")  # at group 0's STARTED, after the plan
    with ThreadPoolExecutor(1) as pool:
        step = pool.submit(compact, str(s.metadata), s.storage, topic_name, 0,
                           {**CONFIGS, "segment.bytes": str(s.tier_segment_bytes)})
        wait_until(lambda: marker.exists() or step.done(), "the compaction step reaches group 0's start")
        monkeypatch.delenv(TIER_PAUSE_AT)  # (the step waits for `resume`; the rewrite below must not pause)
        _rewrite_first_segment(s, topic_name)
        resume.touch()
        summary = step.result(60)
    seconds = time.monotonic() - began

    segs, raw, _ = tiered(s, topic_name)
    for a, b in itertools.pairwise(segs):
        assert b.start_offset == a.end_offset + 1, (a, b)
    served: dict[bytes, bytes | None] = {}
    for b in iter_batches(raw):
        for r in b.records():
            if r.key is not None:
                served[r.key] = r.value
    # the deleted key stays deleted: its tombstone is kept while its old value is (or both went together)
    assert served.get(DEAD) is None, served.get(DEAD)
    assert {k: v for k, v in served.items() if k != DEAD} == latest
    assert summary.stopped >= 1 and "stopped behind" in summary.line(), (summary, seconds)
