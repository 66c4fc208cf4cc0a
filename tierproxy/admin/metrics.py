"""Prometheus metrics as the admin API serves them, named after Kafka's KIP-405 / KIP-930 metrics where Kafka has them.

    tierproxy_remote_fetch_requests_total{topic}   ~ RemoteFetchRequestsPerSec
    tierproxy_remote_fetch_bytes_total{topic}      ~ RemoteFetchBytesPerSec
    tierproxy_remote_fetch_errors_total{topic}     ~ RemoteFetchErrorsPerSec
    tierproxy_remote_log_reader_task_queue_size    ~ RemoteLogReaderTaskQueueSize
    tierproxy_remote_log_reader_avg_idle_percent   ~ RemoteLogReaderAvgIdlePercent
    tierproxy_delayed_remote_fetch_expires_total   ~ DelayedRemoteFetchMetrics.ExpiresPerSec
    tierproxy_fetch_latency_seconds{path=tail|remote}, tierproxy_remote_cache_{hits,misses,bytes}*,
    tierproxy_{client,upstream}_connections, tierproxy_queued_{max_,}request_bytes,
    tierproxy_remote_response_reserved_bytes, tierproxy_request_memory_pauses_total,
    tierproxy_tier_{segments,bytes,lag_offsets,gaps}{topic},
    tierproxy_rlmm_events_applied_total, tierproxy_rlmm_records_skipped_total, tierproxy_rlmm_consumer_restarts_total,
    tierproxy_storage_requests_total{kind}, tierproxy_storage_bytes_total{direction=read|written},
    tierproxy_rlmm_lag_records, tierproxy_ready, tierproxy_remote_fetch_purgatory,
    tierproxy_tier_last_copy_timestamp_seconds{topic},
    tierproxy_remote_answers_while_loading_total, tierproxy_remote_answers_without_broker_offsets_total,
    tierproxy_remote_gap_skips_total, tierproxy_remote_fetch_throttled_total,
    tierproxy_remote_fetches_within_authorization_window_total,
    tierproxy_iceberg_lag_offsets{topic}, tierproxy_iceberg_last_commit_timestamp_seconds, tierproxy_iceberg_files,
    tierproxy_iceberg_rows, tierproxy_iceberg_{live,disk}_bytes, tierproxy_iceberg_snapshots,
    tierproxy_iceberg_manifests (when iceberg.catalog is set); with iceberg.tables, tierproxy_iceberg_typed_rows{table},
    tierproxy_iceberg_dead_letters{table}, tierproxy_iceberg_typed_lag_offsets{table}
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tierproxy.proxy.intercept.fetch import sessions as fetch_sessions
from tierproxy.proxy.metrics import FETCH_LATENCY, REGISTRY

if TYPE_CHECKING:
    from tierproxy.proxy.server import Proxy

__all__ = ["FETCH_LATENCY", "REGISTRY", "ProxyCollector"]



def _iceberg_metrics(st: dict[str, object]) -> Iterator[Metric]:
    """The Iceberg table's figures as last refreshed (every 30 s)."""
    lag = GaugeMetricFamily("tierproxy_iceberg_lag_offsets", "Tiered offsets not in the Iceberg table yet",
                            labels=["topic"])
    per: dict[str, int] = {}
    for part in st.get("partitions", []):  # type: ignore[attr-defined]
        per[part["topic"]] = per.get(part["topic"], 0) + int(part["lag"])
    for topic, n in sorted(per.items()):
        lag.add_metric([topic], n)
    yield lag
    typed = st.get("typed") or []
    for name, help_, key in (
            ("tierproxy_iceberg_typed_rows", "Rows in a typed table's current snapshot", "rows"),
            ("tierproxy_iceberg_dead_letters", "Records in a typed table's dead-letter table", "dead_letters"),
            ("tierproxy_iceberg_typed_lag_offsets", "Tiered offsets not in a typed table yet", "lag_offsets")):
        if typed:
            g = GaugeMetricFamily(name, help_, labels=["table"])
            for t in typed:  # type: ignore[attr-defined]
                g.add_metric([t["table"]], float(t.get(key) or 0))
            yield g
    for name, help_, value in (
            ("tierproxy_iceberg_last_commit_timestamp_seconds", "When the table's current snapshot was committed",
             (st.get("last_commit_ms") or 0) / 1000),  # type: ignore[operator]
            ("tierproxy_iceberg_files", "Data files in the table's current snapshot", st.get("files", 0)),
            ("tierproxy_iceberg_rows", "Rows in the table's current snapshot", st.get("rows", 0)),
            ("tierproxy_iceberg_live_bytes", "Bytes of the table's current snapshot (data files, the metadata "
             "reading it needs)", st.get("live_bytes", 0)),
            ("tierproxy_iceberg_disk_bytes", "Bytes of every file under the table's location",
             st.get("disk_bytes", 0)),
            ("tierproxy_iceberg_snapshots", "Snapshots the table's metadata holds", st.get("snapshots", 0)),
            ("tierproxy_iceberg_manifests", "Manifests of the table's current snapshot", st.get("manifests", 0))):
        g = GaugeMetricFamily(name, help_)
        g.add_metric([], float(value))  # type: ignore[arg-type]
        yield g


def _storage_metrics(counts: dict[str, Any]) -> Iterator[Metric]:
    """The object-store requests this process sent, by kind (`tier.requests`), and their body bytes each way."""
    requests = CounterMetricFamily("tierproxy_storage_requests", "Object-store requests sent, by kind (get, head, "
                                   "put, part, multipart, list, delete; a retry counts again, as S3 bills it)",
                                   labels=["kind"])
    for kind, n in counts["requests"].items():
        requests.add_metric([kind], n)
    yield requests
    nbytes = CounterMetricFamily("tierproxy_storage_bytes", "Object-store body bytes, read from it or written to it",
                                 labels=["direction"])
    nbytes.add_metric(["read"], counts["bytes_read"])
    nbytes.add_metric(["written"], counts["bytes_written"])
    yield nbytes


class ProxyCollector(Collector):
    """Reads the proxy's counters at scrape time (no work on the Kafka path)."""

    def __init__(self, proxy: Proxy) -> None:
        self.proxy = proxy

    def collect(self) -> Iterator[Metric]:
        p = self.proxy
        conns = GaugeMetricFamily("tierproxy_client_connections", "Client connections open")
        conns.add_metric([], len(p.sessions))
        yield conns
        up = GaugeMetricFamily("tierproxy_upstream_connections", "Broker connections open")
        up.add_metric([], sum(1 for s in p.sessions if s.upstream is not None and not s.upstream.is_closing()))
        yield up
        in_flight = GaugeMetricFamily("tierproxy_requests_in_flight", "Client requests read and not yet answered")
        in_flight.add_metric([], sum(len(s.slots) for s in p.sessions))
        yield in_flight
        budget = p.request_budget  # queued.max.request.bytes: the bound, what is drawn on it, how often it paused
        for name, help_, value in (
                ("tierproxy_queued_max_request_bytes", "Bound on request bytes being received and remote "
                 "responses being assembled (all connections)", budget.limit),
                ("tierproxy_queued_request_bytes", "Request bytes being received beyond each connection's own "
                 "64 KiB", budget.used - budget.reserved),
                ("tierproxy_remote_response_reserved_bytes", "Bytes of the bound held for remote responses being "
                 "assembled", budget.reserved)):
            g = GaugeMetricFamily(name, help_)
            g.add_metric([], value)
            yield g
        paused = CounterMetricFamily("tierproxy_request_memory_pauses", "Connections paused for lack of budget")
        paused.add_metric([], budget.pauses)
        yield paused
        tier = p.remote
        if tier is None:
            return
        stats = p.fetch_stats
        for name, help_, data in (
                ("tierproxy_remote_fetch_requests", "Remote fetch reads (RemoteFetchRequestsPerSec)", stats.requests),
                ("tierproxy_remote_fetch_bytes", "Bytes served from the tier (RemoteFetchBytesPerSec)", stats.bytes),
                ("tierproxy_remote_fetch_errors", "Failed remote reads (RemoteFetchErrorsPerSec)", stats.errors)):
            c = CounterMetricFamily(name, help_, labels=["topic"])
            for topic, v in sorted(data.items()):
                c.add_metric([topic], v)
            yield c
        q = GaugeMetricFamily("tierproxy_remote_log_reader_task_queue_size", "Queued remote reads")
        q.add_metric([], tier.pool.queued)
        yield q
        busy = GaugeMetricFamily("tierproxy_remote_log_reader_busy", "Remote reads running")
        busy.add_metric([], tier.pool.running)
        yield busy
        held = GaugeMetricFamily("tierproxy_fetch_session_partitions", "Partitions held in the fetch sessions the "
                                 "proxy holds for clients (at most 200,000 in all)")
        held.add_metric([], fetch_sessions.held())
        yield held
        idle = GaugeMetricFamily("tierproxy_remote_log_reader_avg_idle_percent", "Reader pool idle share")
        idle.add_metric([], tier.pool.idle_percent())
        yield idle
        for name, help_, value in (
                ("tierproxy_delayed_remote_fetch_expires", "Remote partitions expired in purgatory", stats.expired),
                ("tierproxy_remote_answers_while_loading", "Answers made retriable (REPLICA_NOT_AVAILABLE) while the "
                 "segment metadata was not loaded", stats.loading_retriable),
                ("tierproxy_remote_fetch_throttled", "Remote fetch parts held back by a remote fetch quota "
                 "(remote.log.manager.fetch.max.bytes.per.second, remote.fetch.client.max.bytes.per.second)",
                 tier.quota.throttled),
                ("tierproxy_remote_fetches_within_authorization_window", "Remote fetches answered without asking "
                 "the broker: it authorized the connection's fetch of each topic less than "
                 "remote.authorization.cache.ms ago", stats.within_window),
                ("tierproxy_fetch_sessions_opened", "KIP-227 fetch sessions the proxy granted to clients reading "
                 "the tier", stats.sessions_opened),
                ("tierproxy_remote_fetch_sendfile_bytes", "Record bytes sent from a file tier's segment files straight "
                 "to clients' sockets (sendfile, remote.fetch.file.sendfile)", stats.sendfile_bytes),
                ("tierproxy_remote_gap_skips", "Fetches in a gap (deleted before it was tiered) answered up to the "
                 "first offset the tier or the broker holds", stats.gap_skips),
                ("tierproxy_remote_answers_without_broker_offsets", "Remote answers made retriable "
                 "(REPLICA_NOT_AVAILABLE): the leader's high watermark could not be asked", stats.offsets_unknown),
                ("tierproxy_remote_fetch_rejected", "Remote reads rejected by a full pool", tier.pool.rejected),
                ("tierproxy_remote_cache_hits", "Chunk cache hits", tier.reader.hits),
                ("tierproxy_remote_storage_short_reads", "Storage reads shorter than asked (retried)",
                 tier.reader.short_reads),
                ("tierproxy_remote_storage_corrupt_batches", "Batches from storage failing their CRC (not served)",
                 tier.reader.corrupt_batches),
                ("tierproxy_remote_cache_misses", "Chunk cache misses", tier.reader.misses),
                ("tierproxy_remote_storage_read_bytes", "Bytes read from remote storage", tier.reader.bytes_read),
                ("tierproxy_rlmm_events_applied", "Remote log metadata events applied",
                 tier.rlmm.cache.events_applied),
                ("tierproxy_rlmm_records_skipped", "Malformed or inapplicable metadata records skipped",
                 tier.rlmm.records_skipped),
                ("tierproxy_rlmm_consumer_restarts", "Metadata consumer failures (each restarted with backoff)",
                 tier.rlmm.consumer_restarts)):
            c = CounterMetricFamily(name, help_)
            c.add_metric([], value)
            yield c
        yield from _storage_metrics(tier.rsm.store.counts.as_dict())
        rlmm_lag = GaugeMetricFamily("tierproxy_rlmm_lag_records", "Remote log metadata records written but not "
                                     "applied by this replica yet (purges and segments it does not know of)")
        rlmm_lag.add_metric([], tier.rlmm.lag_records() if tier.ready.is_set() else 0)
        yield rlmm_lag
        ready = GaugeMetricFamily("tierproxy_ready", "1 while the remote log metadata is loaded, its consumer runs "
                                  "and it lags no more than metadata.max.lag.records (readyz's tier part)")
        ready.add_metric([], int(tier.serving and tier.rlmm.lag_records() <= p.settings.metadata_max_lag_records))
        yield ready
        purgatory = GaugeMetricFamily("tierproxy_remote_fetch_purgatory", "Fetches waiting for remote reads "
                                      "(DelayedRemoteFetch purgatory)")
        purgatory.add_metric([], stats.purgatory)
        yield purgatory
        cache = GaugeMetricFamily("tierproxy_remote_cache_bytes", "Bytes held by the chunk cache")
        cache.add_metric([], tier.reader.chunks.currsize)
        yield cache
        segs = GaugeMetricFamily("tierproxy_tier_segments", "Remote segments served", labels=["topic"])
        size = GaugeMetricFamily("tierproxy_tier_bytes", "Bytes in remote segments", labels=["topic"])
        last = GaugeMetricFamily("tierproxy_tier_last_copy_timestamp_seconds", "When the newest served segment was "
                                 "copied (its COPY_SEGMENT_FINISHED event): tiering progress", labels=["topic"])
        per: dict[str, list[int]] = {}
        for pc in list(tier.rlmm.cache.partitions.values()):
            n, size_of, newest = pc.summary()  # without making a million segments per scrape
            acc = per.setdefault(pc.tp.topic, [0, 0, 0])
            acc[0] += n
            acc[1] += size_of
            acc[2] = max(acc[2], newest)
        for topic, (n, b, copied) in sorted(per.items()):
            segs.add_metric([topic], n)
            size.add_metric([topic], b)
            last.add_metric([topic], copied / 1000)
        yield segs
        yield size
        yield last
        gaps = GaugeMetricFamily("tierproxy_tier_gaps", "Partitions with a gap (data the broker deleted before it "
                                 "was tiered), refreshed every 30 s", labels=["topic"])
        for topic, n in sorted(stats.gaps.items()):
            gaps.add_metric([topic], n)
        yield gaps
        lag = GaugeMetricFamily("tierproxy_tier_lag_offsets", "Offsets below the LSO not yet tiered, refreshed "
                                "every 30 s", labels=["topic"])
        for topic, n in sorted(stats.lag.items()):
            lag.add_metric([topic], n)
        yield lag
        if stats.iceberg is not None:
            yield from _iceberg_metrics(stats.iceberg)
