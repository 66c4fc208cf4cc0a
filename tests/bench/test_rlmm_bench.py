"""RLMM bootstrap benchmark: ~1M lifecycle events for 250k segments (+50k failed attempts), 80% deleted.

Bootstrap time and peak RSS of a fresh process for (a) full replay of an uncompacted topic holding every
event, (b) the compacted topic (what the log cleaner keeps: the latest value of every live key, emulated
exactly from the same records), (c) the local checkpoint with an empty tail. Goal: (b) and (c) ≥ 20x faster
than (a). The records are the ones the RLMM itself writes (same keys, values, tombstones). Also: (d) the first
start on a metadata topic it creates.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.bench.report import report
from tests.support.segments import seg, tp
from tierproxy.dev.kafkadist import KafkaCluster
from tierproxy.tier.model import SegmentState
from tierproxy.tier.rlmm import RemoteLogMetadataManager, transition
from tierproxy.tier.serde import decode_value, metadata_partition

pytestmark = [pytest.mark.bench, pytest.mark.kafka]
SEGMENTS = int(os.environ.get("TIERPROXY_BENCH_SEGMENTS", "250000"))
USER_PARTITIONS = 2000
S = SegmentState


class Recorder(RemoteLogMetadataManager):
    """The RLMM write path with an in-memory log: yields exactly the records the real backends store."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[tuple[bytes, bytes | None]] = []

    async def start(self) -> None: ...
    async def close(self) -> None: ...
    async def catch_up(self) -> None: ...

    async def publish(self, records: list[tuple[bytes, bytes | None]]) -> None:
        for key, value in records:
            self.apply_record(key, value)
            self.log.append((key, value))


async def _generate() -> list[tuple[bytes, bytes | None]]:
    r = Recorder()
    parts = [tp("bench", p) for p in range(USER_PARTITIONS)]
    per = SEGMENTS // USER_PARTITIONS
    for t in parts:
        mds = []
        for i in range(per):
            if i % 5 == 0:  # a failed attempt first, cleaned up (same epoch, same key as the retry)
                failed = seg(t, i * 100, i * 100 + 99, broker_epoch=1)
                await r.add_segment(failed)
                await r.update_segment(transition(failed, S.DELETE_SEGMENT_STARTED))
                await r.update_segment(transition(failed, S.DELETE_SEGMENT_FINISHED))
            md = seg(t, i * 100, i * 100 + 99, broker_epoch=1)
            await r.add_segment(md)
            await r.update_segment(transition(md, S.COPY_SEGMENT_FINISHED))
            mds.append(md)
        for md in mds[: per * 4 // 5]:  # retention deletes the oldest 80%
            await r.update_segment(transition(md, S.DELETE_SEGMENT_STARTED))
            await r.update_segment(transition(md, S.DELETE_SEGMENT_FINISHED))
    return r.log


def _partition(key: bytes, value: bytes | None, where: dict[bytes, int]) -> int:
    if value is not None:
        ev = decode_value(value)
        t = ev.segment_id.tp if hasattr(ev, "segment_id") else ev.tp  # type: ignore[union-attr]
        where[key] = metadata_partition(t, 50)
    return where[key]


def _produce(bootstrap: str, topic: str, records: list[tuple[bytes, bytes | None, int]], compact: bool) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    # the full log is a compacted topic whose cleaner never runs (the RLMM refuses a topic that is not compacted)
    cfg = {"cleanup.policy": "compact", "retention.ms": "-1"}
    if not compact:
        cfg["min.compaction.lag.ms"] = str(2**63 - 1)
    admin.create_topics([NewTopic(topic, 50, 1, config=cfg)])[topic].result(30)
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1 << 20, "enable.idempotence": True,
                  "queue.buffering.max.messages": 2_000_000})
    for key, value, part in records:
        p.produce(topic, value, key, partition=part)
        p.poll(0)
    assert p.flush(120) == 0


def _bootstrap(bootstrap: str, topic: str, checkpoint: Path | None = None) -> dict[str, float]:
    args = [sys.executable, "-m", "tests.bench.rlmm_bootstrap", bootstrap, topic]
    if checkpoint is not None:
        args.append(str(checkpoint))
    out = subprocess.run(args, capture_output=True, text=True, timeout=1800)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_bootstrap_full_replay_vs_compacted_vs_checkpoint(kafka: KafkaCluster, tmp_path: Path) -> None:
    import asyncio

    log = asyncio.run(_generate())
    where: dict[bytes, int] = {}
    full = [(k, v, _partition(k, v, where)) for k, v in log]
    latest: dict[bytes, tuple[int, bytes | None, int]] = {}
    for i, (k, v, p) in enumerate(full):
        latest[k] = (i, v, p)
    compacted = [(k, v, p) for k, (_, v, p) in sorted(latest.items(), key=lambda kv: kv[1][0]) if v is not None]
    events = sum(1 for _, v, _ in full if v is not None)
    run_id = uuid.uuid4().hex[:6]
    t_full, t_compact = f"__bench-full-{run_id}", f"__bench-compact-{run_id}"
    _produce(kafka.bootstrap, t_full, full, compact=False)
    _produce(kafka.bootstrap, t_compact, compacted, compact=True)

    a = _bootstrap(kafka.bootstrap, t_full)
    b = _bootstrap(kafka.bootstrap, t_compact)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    _bootstrap(kafka.bootstrap, t_compact, ckpt)  # writes the checkpoint
    c = _bootstrap(kafka.bootstrap, t_compact, ckpt)
    assert a["live"] == b["live"] == c["live"] == SEGMENTS // USER_PARTITIONS // 5 * USER_PARTITIONS
    assert c["consumed"] == 0
    empty = _bootstrap(kafka.bootstrap, f"__bench-empty-{run_id}")  # a first start: the topic created, nothing in it
    assert empty["live"] == 0
    report("RLMM bootstrap", (
        f"{events} events + {len(full) - events} tombstones, {SEGMENTS} segments, {a['live']:.0f} live: "
        f"full replay {a['seconds']:.1f}s ({a['consumed']:.0f} records, peak RSS {a['rss_mib']:.0f} MiB); "
        f"compacted topic {b['seconds']:.2f}s ({b['consumed']:.0f} records, peak RSS {b['rss_mib']:.0f} MiB, "
        f"{a['seconds'] / b['seconds']:.0f}x faster); checkpoint {c['seconds']:.2f}s (peak RSS "
        f"{c['rss_mib']:.0f} MiB, {a['seconds'] / c['seconds']:.0f}x faster); first start on a new topic "
        f"{empty['seconds']:.2f}s"))
    assert a["seconds"] > b["seconds"] and a["seconds"] > c["seconds"]
