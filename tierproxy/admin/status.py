"""What the admin API reports of the tier: per topic and partition (offsets, segments, lag, gaps, holes), the
remote fetch path, the Iceberg table; and the refresh behind the lag and gap metrics."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from protocol.messages import MetadataResponseTopic, MetadataResponseTopicPartition
from tierproxy.admin.models import PartitionStatus, RemoteFetchStatus, TopicSummary
from tierproxy.proxy.server import Proxy
from tierproxy.remote.view import BrokerOffsets
from tierproxy.tier.model import uuid_str
from tierproxy.tier.rules import lost_range, tiering_lag, topic_setting

log = logging.getLogger("tierproxy.admin")


def topic_summary(proxy: Proxy, name: str, t: MetadataResponseTopic) -> TopicSummary:
    segs = nbytes = 0
    for p in t["partitions"]:
        pc = proxy.remote.partition_by_id(t["topic_id"], p["partition_index"]) if proxy.remote else None
        if pc is not None:
            n, size_of, _ = pc.summary()
            segs += n
            nbytes += size_of
    s = proxy.settings
    ms = topic_setting(s.tier_topic_overrides, name, "retention.ms", s.tier_retention_ms)
    max_bytes = topic_setting(s.tier_topic_overrides, name, "retention.bytes", s.tier_retention_bytes)
    cache = proxy.remote.rlmm.cache if proxy.remote else None
    origin = cache.aliases.get(bytes(t["topic_id"])) if cache else None
    mount = cache.mounts.get(origin) if cache is not None and origin is not None else None
    return TopicSummary(topic=name, topic_id=uuid_str(t["topic_id"]), partitions=len(t["partitions"]),
                        tiered_segments=segs, tiered_bytes=nbytes, tier_retention_ms=ms,
                        tier_retention_bytes=max_bytes, history_topic_id=uuid_str(origin) if origin else None,
                        restored_from_cluster=mount.origin_cluster if mount else None)


def remote_status(proxy: Proxy) -> RemoteFetchStatus:
    tier = proxy.remote
    if tier is None:
        return RemoteFetchStatus(enabled=False, ready=False, purgatory=0, pool_running=0, pool_queued=0,
                                 pool_threads=0, rejected=0, expired=0, cache_hit_ratio=None, cache_bytes=0,
                                 requests_total=0, bytes_total=0, errors_total=0)
    stats = proxy.fetch_stats
    lookups = tier.reader.hits + tier.reader.misses
    return RemoteFetchStatus(enabled=True, ready=tier.ready.is_set(), purgatory=stats.purgatory,
                             pool_running=tier.pool.running, pool_queued=tier.pool.queued,
                             pool_threads=tier.pool.threads, rejected=tier.pool.rejected, expired=stats.expired,
                             cache_hit_ratio=tier.reader.hits / lookups if lookups else None,
                             cache_bytes=int(tier.reader.chunks.currsize), requests_total=sum(stats.requests.values()),
                             bytes_total=sum(stats.bytes.values()), errors_total=sum(stats.errors.values()))


async def topic_status(proxy: Proxy, topic: str, topic_id: bytes, partitions: list[MetadataResponseTopicPartition]
                       ) -> list[PartitionStatus]:
    """Each of `partitions`' status, the leaders' offsets asked for all of them at once (one ListOffsets per
    leader: a topic of thousands of partitions asked one by one took a round trip each)."""
    found: dict[tuple[str, int], BrokerOffsets] = {}
    if proxy.remote is not None and partitions:
        try:
            found = await asyncio.wait_for(proxy.remote.broker_offsets_many(
                [(topic, p["partition_index"]) for p in partitions]), 10)
        except Exception:
            found = {}
    return [partition_status(proxy, topic_id, p, found.get((topic, p["partition_index"]))) for p in partitions]


def partition_status(proxy: Proxy, topic_id: bytes, p: MetadataResponseTopicPartition,
                     offsets: BrokerOffsets | None) -> PartitionStatus:
    """A partition's status from the tier's metadata and its leader's offsets (None: not known)."""
    n = p["partition_index"]
    pc = proxy.remote.partition_by_id(topic_id, n) if proxy.remote else None
    finished = list(pc.finished()) if pc else []
    tier_end = pc.latest_tiered_offset() if pc else -1
    gap = None
    lag = None
    if offsets is not None:
        lag = tiering_lag(tier_end, offsets.log_start, offsets.last_stable)
        first_missing = max(tier_end + 1, pc.log_start_offset if pc else 0)  # below a purge: deleted on purpose
        lost = lost_range(first_missing, offsets.log_start, offsets.log_start) if tier_end >= 0 else None
        gap = list(lost) if lost is not None else None
    return PartitionStatus(partition=n, leader=p["leader_id"],
                           broker_log_start=offsets.log_start if offsets else None,
                           high_watermark=offsets.high_watermark if offsets else None,
                           last_stable_offset=offsets.last_stable if offsets else None,
                           tier_start=pc.earliest_offset() if pc else None,
                           purged_below=pc.log_start_offset if pc else 0, tier_end=tier_end,
                           segments=len(finished), tier_bytes=sum(m.segment_size_in_bytes for m in finished),
                           tiering_lag=lag, gap=gap, holes=[list(h) for h in pc.holes()] if pc else [])


async def iceberg_status(proxy: Proxy) -> dict[str, Any]:
    """The table's status from its catalog against the tier's metadata this replica holds."""
    from tierproxy.jobs.iceberg.status import serve_catalog, table_status, typed_status

    s = proxy.settings
    cfg = serve_catalog(s.storage, s.iceberg_catalog, s.iceberg_catalog_credential, s.iceberg_catalog_token)
    ends: dict[tuple[str, int], tuple[str, int]] = {}
    if proxy.remote is not None:
        for pc in list(proxy.remote.rlmm.cache.partitions.values()):
            last = pc.latest_tiered_offset()
            if last >= 0:
                ends[(uuid_str(pc.tp.topic_id), pc.tp.partition)] = (pc.tp.topic, last + 1)
    found: dict[str, Any] = await asyncio.to_thread(table_status, cfg, s.iceberg_table, ends)
    if s.iceberg_tables:
        found["typed"] = await asyncio.to_thread(typed_status, cfg, s.iceberg_tables, ends)
    return found


async def refresh_tier_status(proxy: Proxy, interval_s: float = 30.0) -> None:
    """Every `interval_s`, per tiered topic: offsets below the LSO not tiered yet (summed over its partitions) and
    how many partitions have a gap, for `tierproxy_tier_lag_offsets` and `tierproxy_tier_gaps` (and their alerts)."""
    while True:
        if proxy.remote is not None and not proxy.remote.ready.is_set():
            await asyncio.sleep(1.0)  # the figures need the tier's metadata: the first round as soon as it is loaded
            continue
        if proxy.remote is not None and proxy.remote.serving:
            try:
                topics = await asyncio.wait_for(proxy.cluster_topics(), 10)
                for name, t in topics.items():
                    tiered = [p for p in t["partitions"]
                              if proxy.remote.partition_by_id(t["topic_id"], p["partition_index"]) is not None]
                    if not tiered:
                        continue
                    states = await topic_status(proxy, name, t["topic_id"], tiered)
                    proxy.fetch_stats.lag[name] = sum(st.tiering_lag or 0 for st in states)
                    proxy.fetch_stats.gaps[name] = sum(1 for st in states if st.gap)
            except Exception as exc:  # the next round tries again
                log.debug("tier status refresh: %s", exc)
        if proxy.settings.iceberg_catalog:
            try:
                proxy.fetch_stats.iceberg = await iceberg_status(proxy)
            except Exception as exc:
                log.warning("iceberg table status: %s", exc)
        await asyncio.sleep(interval_s)
