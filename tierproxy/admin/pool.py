"""One `/metrics` for the workers of `serve --workers N`, summed as Prometheus' multiprocess mode sums them.

Every worker but the first writes its metrics (Prometheus' text format) to `worker-INDEX-PID.prom` in a directory the
supervisor made, every 5 s; the first serves the admin API and adds those files to its own metrics. When a worker
dies the supervisor renames its file `dead-INDEX-PID.prom`: its counters and histograms still count (a total never
drops when a worker is restarted), its gauges no longer do. Gauges are summed (connections, bytes held, bounds: each
worker holds 1/N of a bound, so the sum is the configured total), except those every worker computes from the same
view of the tier (`SAME_VIEW`). Beside them: `tierproxy_worker_up{worker,pid}` and
`tierproxy_worker_client_connections{worker,pid}` (how the kernel spread the connections), and the supervisor's
`tierproxy_workers` and `tierproxy_worker_restarts_total{worker}` (`supervisor.prom`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families

from tierproxy.admin.metrics import REGISTRY, ProxyCollector

if TYPE_CHECKING:
    from tierproxy.proxy.server import Proxy

log = logging.getLogger("tierproxy.admin.pool")
EXPORT_INTERVAL_S = 5.0  # what a scrape of the pool may lag behind a worker; each export walks the tier's view
# gauges each worker computes from the same view (the tier, the metadata): the pool's value is one worker's, not a sum
SAME_VIEW = {"tierproxy_ready": min, "tierproxy_tier_segments": max, "tierproxy_tier_bytes": max,
             "tierproxy_tier_last_copy_timestamp_seconds": max, "tierproxy_tier_gaps": max,
             "tierproxy_tier_lag_offsets": max, "tierproxy_rlmm_lag_records": max,
             "tierproxy_iceberg_lag_offsets": max, "tierproxy_iceberg_last_commit_timestamp_seconds": max,
             "tierproxy_iceberg_files": max, "tierproxy_iceberg_rows": max, "tierproxy_iceberg_typed_rows": max,
             "tierproxy_iceberg_dead_letters": max, "tierproxy_iceberg_typed_lag_offsets": max,
             "tierproxy_iceberg_live_bytes": max, "tierproxy_iceberg_disk_bytes": max,
             "tierproxy_iceberg_snapshots": max, "tierproxy_iceberg_manifests": max}


def _register(proxy: Proxy) -> None:
    if not getattr(proxy, "_collector", None):
        REGISTRY.register(ProxyCollector(proxy))
        proxy._collector = True  # type: ignore[attr-defined]


async def export_metrics(proxy: Proxy, directory: Path, index: int) -> None:
    """A worker's metrics written to `directory` every EXPORT_INTERVAL_S for the first worker's `/metrics` (a service of
    `serve`: the file is replaced whole, so a reader never sees half of it)."""
    _register(proxy)
    path = directory / f"worker-{index}-{os.getpid()}.prom"
    tmp = path.with_suffix(".tmp")

    async def loop() -> None:
        while True:
            if proxy.remote is not None:  # its metadata records applied first, a partition per turn of the loop
                await proxy.remote.rlmm.cache.index_gradually()
            try:
                tmp.write_bytes(generate_latest(REGISTRY))
                os.replace(tmp, path)
            except OSError as exc:  # the directory gone: the supervisor is stopping
                log.debug("worker metrics not written: %s", exc)
            await asyncio.sleep(EXPORT_INTERVAL_S)

    proxy.spawn(loop())


class PoolRegistry(CollectorRegistry):
    """What the first worker's `/metrics` serves: its own registry and the other workers' files, merged."""

    def __init__(self, directory: Path, index: int) -> None:
        super().__init__(auto_describe=False)
        self.directory = directory
        self.index = index

    def _sources(self) -> Iterator[tuple[str, str, bool, list[Metric]]]:
        """(worker, pid, alive, families) of each worker, this one first; then the supervisor's own."""
        yield str(self.index), str(os.getpid()), True, list(REGISTRY.collect())
        for path in sorted(self.directory.glob("*.prom")):
            with contextlib.suppress(OSError, ValueError):  # renamed or replaced as it is read: next scrape
                families = list(text_string_to_metric_families(path.read_text()))
                kind, _, rest = path.stem.partition("-")
                worker, _, pid = rest.partition("-")
                if kind == "worker" and pid == str(os.getpid()):
                    continue  # this worker's own file (none is written by the first; a safeguard)
                yield worker, pid, kind in ("worker", "supervisor"), families

    def collect(self) -> Iterator[Metric]:
        merged: dict[str, Metric] = {}
        values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], list[float]]] = {}
        up = GaugeMetricFamily("tierproxy_worker_up", "1 for each serve worker running", labels=["worker", "pid"])
        conns = GaugeMetricFamily("tierproxy_worker_client_connections", "Client connections open, per worker",
                                  labels=["worker", "pid"])
        for worker, pid, alive, families in self._sources():
            if worker and pid and alive:
                up.add_metric([worker, pid], 1)
                conns.add_metric([worker, pid], _value(families, "tierproxy_client_connections"))
            for fam in families:
                if fam.type in ("gauge", "unknown", "info", "stateset") and not alive:
                    continue  # a dead worker's gauges say nothing now
                merged.setdefault(fam.name, fam)
                per = values.setdefault(fam.name, {})
                for s in fam.samples:
                    if s.name.endswith("_created"):
                        continue  # a creation time: not summable
                    per.setdefault((s.name, tuple(sorted(s.labels.items()))), []).append(s.value)
        for name, fam in merged.items():
            combine = SAME_VIEW.get(name, sum) if fam.type == "gauge" else sum
            out = Metric(name, fam.documentation, fam.type, fam.unit)
            for (sample, labels), vs in values[name].items():
                out.add_sample(sample, dict(labels), float(combine(vs)))
            yield out
        yield up
        yield conns


def _value(families: Iterable[Metric], name: str) -> float:
    for fam in families:
        if fam.name == name:
            return sum(s.value for s in fam.samples)
    return 0.0
