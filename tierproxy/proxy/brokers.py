"""Port-per-broker mapping: each upstream node id gets proxy port `broker.port.base + node_id`.

The mapping is a pure function of the node id, so it is stable across proxy restarts and identical on every
proxy replica. Upstream addresses are learned from Metadata/DescribeCluster responses and refreshed on demand.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

log = logging.getLogger("tierproxy.proxy.brokers")


class BrokerMap:
    """node id ↔ upstream (host, port) ↔ proxy port."""

    def __init__(self, advertised_host: str, port_base: int, port_range: int,
                 on_new_node: Callable[[int], None]) -> None:
        self.advertised_host = advertised_host
        self.port_base = port_base
        self.port_range = port_range
        self.upstream: dict[int, tuple[str, int]] = {}
        self._on_new_node = on_new_node
        self._warned: set[int] = set()

    def port_for(self, node_id: int) -> int | None:
        if 0 <= node_id < self.port_range:
            return self.port_base + node_id
        return None

    def learn(self, nodes: Iterable[tuple[int, str, int]]) -> None:
        for node_id, host, port in nodes:
            if self.upstream.get(node_id) != (host, port):
                known = node_id in self.upstream
                self.upstream[node_id] = (host, port)
                if not known:
                    log.info("broker %d at %s:%d → proxy port %s", node_id, host, port, self.port_for(node_id))
                    self._on_new_node(node_id)

    def proxy_address(self, node_id: int, host: str, port: int) -> tuple[str, int]:
        """The address clients must use for `node_id` (its upstream address is recorded on the way)."""
        self.learn([(node_id, host, port)])
        proxy_port = self.port_for(node_id)
        if proxy_port is None:
            if node_id not in self._warned:
                self._warned.add(node_id)
                log.error("broker node id %d is outside broker.port.range %d: clients will reach it directly; "
                          "raise broker.port.range", node_id, self.port_range)
            return host, port
        return self.advertised_host, proxy_port
