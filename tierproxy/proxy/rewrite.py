"""Response rewrites that keep clients talking to the proxy.

Broker addresses are replaced by the proxy's (advertised host, port-per-broker) in Metadata, FindCoordinator
(v0-3 fields and v4+ `coordinators[]`), DescribeCluster and the KIP-951 NodeEndpoints of Fetch and Produce.
ApiVersions is capped to what the `protocol` package decodes for the APIs the proxy intercepts.
Pure: messages in, messages out (the session-bound relay is `proxy.relay`).
"""

from __future__ import annotations

from collections.abc import Callable

from protocol import registry
from protocol.constants import ApiKey
from protocol.messages import (
    ApiVersionsResponse,
    ApiVersionsResponseApiKey,
    DescribeClusterResponse,
    FetchResponse,
    FindCoordinatorResponse,
    MetadataResponse,
    ProduceResponse,
)

AddressOf = Callable[[int, str, int], tuple[str, int]]  # (node_id, upstream host, port) → proxy address

CONTROLLER_ENDPOINTS = 2  # DescribeCluster endpoint_type: 1 brokers, 2 controllers

# APIs whose responses the proxy decodes; ApiVersions is capped to the codec's range for them.
INTERCEPTED = frozenset({ApiKey.METADATA, ApiKey.FIND_COORDINATOR, ApiKey.DESCRIBE_CLUSTER, ApiKey.API_VERSIONS,
                         ApiKey.FETCH, ApiKey.LIST_OFFSETS, ApiKey.OFFSET_FOR_LEADER_EPOCH})


def cap_api_versions(data: ApiVersionsResponse) -> ApiVersionsResponse:
    """Intersect the broker's ranges with the codec's for intercepted APIs; others pass as the broker says.

    Produce keeps the broker's minimum (old versions carry no NodeEndpoints and stay opaque) but is capped
    at the codec's maximum. (SaslHandshake stays as the broker says: librdkafka requires v0 to be listed.)
    """
    keys: list[ApiVersionsResponseApiKey] = []
    for entry in data["api_keys"]:
        key = entry["api_key"]
        lo, hi = entry["min_version"], entry["max_version"]
        if key in INTERCEPTED:
            s = registry.SUPPORTED[key]
            lo, hi = max(lo, s.min_version), min(hi, s.max_version)
        elif key == ApiKey.PRODUCE:
            hi = min(hi, registry.SUPPORTED[ApiKey.PRODUCE].max_version)
        if lo <= hi:
            keys.append({**entry, "min_version": lo, "max_version": hi})
    return {**data, "api_keys": keys}


def rewrite_metadata(data: MetadataResponse, address_of: AddressOf) -> list[tuple[int, str, int]]:
    """Rewrite brokers[] in place; return the upstream (node_id, host, port) seen."""
    seen = []
    for b in data["brokers"]:
        seen.append((b["node_id"], b["host"], b["port"]))
        b["host"], b["port"] = address_of(b["node_id"], b["host"], b["port"])
    return seen


def rewrite_find_coordinator(data: FindCoordinatorResponse, version: int, address_of: AddressOf) -> None:
    if version >= 4:
        for c in data["coordinators"]:
            if c["node_id"] >= 0:  # an error entry carries node_id -1 and no address
                c["host"], c["port"] = address_of(c["node_id"], c["host"], c["port"])
    elif data["node_id"] >= 0:
        data["host"], data["port"] = address_of(data["node_id"], data["host"], data["port"])


def rewrite_describe_cluster(data: DescribeClusterResponse, address_of: AddressOf) -> list[tuple[int, str, int]]:
    if data.get("endpoint_type", 1) == CONTROLLER_ENDPOINTS:
        return []  # controllers are not proxied: their node ids may clash with brokers' in combined mode
    seen = []
    for b in data["brokers"]:
        seen.append((b["broker_id"], b["host"], b["port"]))
        b["host"], b["port"] = address_of(b["broker_id"], b["host"], b["port"])
    return seen


def rewrite_node_endpoints(data: FetchResponse | ProduceResponse, address_of: AddressOf) -> bool:
    """KIP-951 NodeEndpoints of Fetch (v16+) and Produce (v10+); True when there were any."""
    endpoints = data.get("node_endpoints") or []
    for e in endpoints:
        e["host"], e["port"] = address_of(e["node_id"], e["host"], e["port"])
    return bool(endpoints)
