"""Relaying a response that may carry broker addresses (KIP-951 NodeEndpoints of Fetch v16+ and Produce v10+):
decoded and re-encoded only when it does."""

from __future__ import annotations

from typing import cast

from protocol import registry
from protocol.apis.fetch_scan import FetchScan, scan_fetch_response
from protocol.connection import ResponseEvent
from protocol.constants import ApiKey
from protocol.messages import FetchResponse, ProduceResponse
from tierproxy.proxy import rewrite
from tierproxy.proxy.session import Session, Slot, as_received


def relay_with_endpoints(session: Session, slot: Slot, ev: ResponseEvent,
                         data: FetchResponse | ProduceResponse | None = None, scan: FetchScan | None = None) -> None:
    """Fetch v16+ / Produce v10+: re-encode only a response that carries NodeEndpoints; relay the rest as is
    (for Fetch a scan tells, so a response without them is never decoded)."""
    is_fetch = ev.api_key == ApiKey.FETCH
    if ev.api_version < (16 if is_fetch else 10) or not registry.supports(ev.api_key, ev.api_version):
        slot.chunks = as_received(ev)
        return
    if is_fetch and data is None:
        scan = scan or scan_fetch_response(ev.frame, ev.api_version, ev.body_offset)
        if not scan.node_endpoints:
            slot.chunks = as_received(ev)
            return
    if data is None:
        data = cast(FetchResponse | ProduceResponse,
                    registry.decode_response(ev.api_key, ev.api_version, ev.frame, ev.body_offset))
    if rewrite.rewrite_node_endpoints(data, session.proxy.brokers.proxy_address):
        slot.chunks = registry.encode_response(ev.api_key, ev.api_version, ev.correlation_id, data)
    else:
        slot.chunks = as_received(ev)
