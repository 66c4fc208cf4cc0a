"""Metrics recorded on the Kafka path, below every layer that records them (the admin app only serves them).

    tierproxy_fetch_latency_seconds{path=tail|remote}   Fetch latency through the proxy
    RemoteFetchStats                                      remote serving counters, exported at scrape time

Everything else the admin API exports is read from the proxy's counters at scrape time
(`tierproxy.admin.metrics.ProxyCollector`), so nothing on the Kafka path depends on the admin layer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Histogram

REGISTRY = CollectorRegistry(auto_describe=True)
FETCH_LATENCY = Histogram("tierproxy_fetch_latency_seconds", "Fetch latency through the proxy", ["path"],
                          buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
                          registry=REGISTRY)


@dataclass
class RemoteFetchStats:
    """What remote serving counts, per topic where Kafka's metrics are per topic (KIP-405 / KIP-930 names); the
    admin API reads it at scrape time. The intercepts record, the remote service owns it."""

    requests: dict[str, int] = field(default_factory=dict)  # RemoteFetchRequestsPerSec
    bytes: dict[str, int] = field(default_factory=dict)  # RemoteFetchBytesPerSec
    errors: dict[str, int] = field(default_factory=dict)  # RemoteFetchErrorsPerSec
    gaps: dict[str, int] = field(default_factory=dict)  # seen by the admin API
    lag: dict[str, int] = field(default_factory=dict)
    expired: int = 0  # partitions expired in purgatory (DelayedRemoteFetchMetrics.ExpiresPerSec)
    purgatory: int = 0  # delayed remote fetches waiting now
    loading_retriable: int = 0  # answers made retriable (REPLICA_NOT_AVAILABLE) while the metadata was not loaded
    gap_skips: int = 0  # fetches in a gap (never tiered) moved to the first offset the tier or broker holds
    offsets_unknown: int = 0  # remote answers made retriable: the leader's HW / LSO / log start could not be asked
    within_window: int = 0  # remote fetches answered without the broker (remote.authorization.cache.ms)
    sessions_opened: int = 0  # KIP-227 fetch sessions the proxy granted to clients reading the tier
    sendfile_bytes: int = 0  # record bytes sent from the tier's files with sendfile (remote.fetch.file.sendfile)
    iceberg: dict[str, Any] | None = None  # the Iceberg table's status (iceberg.status.table_status), refreshed by
    # the admin API every 30 s when iceberg.catalog is set

    def served(self, topic: str, nbytes: int) -> None:
        self.requests[topic] = self.requests.get(topic, 0) + 1
        self.bytes[topic] = self.bytes.get(topic, 0) + nbytes

    def failed(self, topic: str) -> None:
        self.errors[topic] = self.errors.get(topic, 0) + 1
