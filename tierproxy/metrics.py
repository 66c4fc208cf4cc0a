"""Metrics recorded on the Kafka path, below every layer that records them (the admin app only serves them).

    tierproxy_fetch_latency_seconds{path=tail|remote}   Fetch latency through the proxy

Everything else the admin API exports is read from the proxy's counters at scrape time
(`tierproxy.admin.metrics.ProxyCollector`), so nothing on the Kafka path depends on the admin layer.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram

REGISTRY = CollectorRegistry(auto_describe=True)
FETCH_LATENCY = Histogram("tierproxy_fetch_latency_seconds", "Fetch latency through the proxy", ["path"],
                          buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
                          registry=REGISTRY)
