"""The first worker's /metrics for `serve --workers N`: the other workers' files summed into its own, a dead
worker's counters kept and its gauges dropped, the tier's gauges (one view in every worker) not multiplied."""

from __future__ import annotations

import os
from pathlib import Path

from prometheus_client import generate_latest

from tierproxy.admin.pool import PoolRegistry

LIVE = """# HELP tierproxy_remote_fetch_bytes_total Bytes served from the tier
# TYPE tierproxy_remote_fetch_bytes_total counter
tierproxy_remote_fetch_bytes_total{topic="a"} 10.0
# HELP tierproxy_client_connections Client connections open
# TYPE tierproxy_client_connections gauge
tierproxy_client_connections {conns}
# HELP tierproxy_tier_segments Remote segments served
# TYPE tierproxy_tier_segments gauge
tierproxy_tier_segments{topic="a"} 5.0
"""


def _lines(pool: PoolRegistry) -> set[str]:
    return set(generate_latest(pool).decode().splitlines())


def test_counters_of_every_worker_sum_and_a_dead_workers_gauges_drop(tmp_path: Path) -> None:
    (tmp_path / "worker-1-901.prom").write_text(LIVE.replace("{conns}", "3.0"))
    (tmp_path / "worker-2-902.prom").write_text(LIVE.replace("{conns}", "4.0"))
    (tmp_path / "dead-1-900.prom").write_text(LIVE.replace("{conns}", "100.0"))  # before its restart
    (tmp_path / "supervisor.prom").write_text("# TYPE tierproxy_worker_restarts_total counter\n"
                                              'tierproxy_worker_restarts_total{worker="1"} 1.0\n')
    lines = _lines(PoolRegistry(tmp_path, 0))
    assert 'tierproxy_remote_fetch_bytes_total{topic="a"} 30.0' in lines, "the dead worker's 10 still count"
    assert "tierproxy_client_connections 7.0" in lines, "live workers' gauges sum; the dead one's 100 do not"
    assert 'tierproxy_tier_segments{topic="a"} 5.0' in lines, "every worker sees the same tier: not 15"
    assert 'tierproxy_worker_restarts_total{worker="1"} 1.0' in lines
    up = {line for line in lines if line.startswith("tierproxy_worker_up{")}
    assert up == {f'tierproxy_worker_up{{pid="{os.getpid()}",worker="0"}} 1.0',
                  'tierproxy_worker_up{pid="901",worker="1"} 1.0', 'tierproxy_worker_up{pid="902",worker="2"} 1.0'}
    assert 'tierproxy_worker_client_connections{pid="902",worker="2"} 4.0' in lines
    assert not any("_created" in line and "remote_fetch_bytes" in line for line in lines)
