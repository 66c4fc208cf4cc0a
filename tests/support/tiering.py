"""Running tiering passes in tests and reading back what the tier holds."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from protocol.records import iter_batches
from tierproxy.config import TierSettings
from tierproxy.jobs.tiering.job import RunSummary, run_loop
from tierproxy.tier.indexes import decode_txn_index
from tierproxy.tier.model import RemoteLogSegmentMetadata
from tierproxy.tier.open import open_metadata
from tierproxy.tier.rsm import IndexType, RemoteStorageManager


def settings(bootstrap: str, tmp: Path, topic: str, **kw: Any) -> TierSettings:
    """Tier only `topic` (tests share one broker)."""
    base: dict[str, Any] = {"bootstrap_servers": bootstrap, "tier_topics": re.escape(topic),
                            "storage": f"file://{tmp}/tier",
                            "metadata": f"file://{tmp}/meta", "tier_segment_bytes": 64 * 1024,
                            "spark_master": "local[2]", "tier_state_dir": tmp / "state"}
    base.update(kw)
    return TierSettings(**base)


def tier_once(s: TierSettings) -> RunSummary:
    """One pass of `tierproxy tier` in this process, on its Spark session (`spark.worker_session`)."""
    from tests.support.spark import worker_session

    return run_loop(s, once=True, progress=False, spark=worker_session())[-1]


def tiered(s: TierSettings, topic: str, partition: int = 0) -> tuple[list[RemoteLogSegmentMetadata], bytes, list[Any]]:
    """The served segments of a partition, their concatenated log bytes and their aborted transactions."""
    async def run() -> tuple[list[RemoteLogSegmentMetadata], bytes, list[Any]]:
        rlmm = open_metadata(s.metadata, s.bootstrap_servers)
        await rlmm.start()
        rsm = RemoteStorageManager.from_uri(s.storage)
        try:
            pc = rlmm.cache.find(topic, partition)
            segs = list(pc.finished()) if pc else []
            logs = [await rsm.fetch_log(md, 0) for md in segs]
            txns = [a for md in segs for a in decode_txn_index(await rsm.fetch_index(md, IndexType.TRANSACTION))]
            return segs, b"".join(logs), txns
        finally:
            await rsm.close()
            await rlmm.close()

    return asyncio.run(run())


def offsets_of(raw: bytes) -> list[int]:
    return [o for b in iter_batches(raw) for o in range(b.base_offset, b.last_offset + 1)]


def produce_everything(bootstrap: str, topic: str) -> None:
    """Every codec, headers, null keys and values, and transactions (one aborted) between them."""
    for codec in ("none", "gzip", "snappy", "lz4", "zstd"):
        p = Producer({"bootstrap.servers": bootstrap, "compression.type": codec, "linger.ms": 5})
        for i in range(300):
            key = None if i % 4 == 0 else f"{codec}-{i}".encode()
            value = None if i % 7 == 0 else (f"{codec}-value-{i}-" * 20).encode()
            p.produce(topic, value, key, headers=[("h", f"{i}".encode()), ("empty", None)])
        p.flush(30)
    tx = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"tx-{topic}", "linger.ms": 0})
    plain = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    tx.init_transactions(30)
    for outcome in ("commit", "abort", "commit", "abort"):
        tx.begin_transaction()
        for i in range(40):  # interleaved with non-transactional writes: the txn spans tier segments
            tx.produce(topic, (f"{outcome}-{i}-" * 30).encode())
            tx.flush(10)
            plain.produce(topic, f"plain-{outcome}-{i}".encode())
            plain.flush(10)
        if outcome == "commit":
            tx.commit_transaction(30)
        else:
            tx.abort_transaction(30)
    plain.produce(topic, b"after-the-transactions")  # moves the LSO past the last marker
    plain.flush(10)
