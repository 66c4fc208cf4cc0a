"""Request and response handlers: address rewrites, ApiVersions capping, and the tier-aware Fetch (sessionless
upstream; see `intercept.fetch`). Every API without a handler is relayed as an opaque frame."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, TypeVar, cast

from protocol import registry
from protocol.connection import RequestEvent, ResponseEvent
from protocol.constants import ApiKey, ErrorCode
from protocol.errors import ProtocolError
from protocol.messages import (
    ApiVersionsResponse,
    DescribeClusterResponse,
    FindCoordinatorResponse,
    MetadataResponse,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
)
from tierproxy.proxy import relay, rewrite
from tierproxy.proxy.intercept import fetch, offsets
from tierproxy.proxy.session import RequestHandler, ResponseHandler, Session, Slot, as_received

log = logging.getLogger("tierproxy.proxy.handlers")


M = TypeVar("M")


def _encode(ev: ResponseEvent, data: Mapping[str, Any], version: int | None = None) -> registry.Chunks:
    return registry.encode_response(ev.api_key, ev.api_version if version is None else version,
                                    ev.correlation_id, data)


def _decode(session: Session, slot: Slot, ev: ResponseEvent, kind: type[M]) -> M | None:
    """Decode an intercepted response as the message `kind`; if its version is beyond the codec, relay it
    untouched with a warning."""
    if not registry.supports(ev.api_key, ev.api_version):
        log.warning("client %s uses %s v%d beyond the codec's range: relayed without rewriting", session.peer,
                    registry.SUPPORTED[ev.api_key].name, ev.api_version)
        slot.chunks = as_received(ev)
        return None
    return cast(M, registry.decode_response(ev.api_key, ev.api_version, ev.frame, ev.body_offset))


def api_versions_request(session: Session, ev: RequestEvent) -> None:
    """A version beyond the codec is answered as a broker would: v0 UNSUPPORTED_VERSION with our range."""
    s = registry.SUPPORTED[ApiKey.API_VERSIONS]
    if ev.header.api_version <= s.max_version:
        session.forward(ev)
        return
    body = {"error_code": ErrorCode.UNSUPPORTED_VERSION, "api_keys": [
        {"api_key": ApiKey.API_VERSIONS, "min_version": s.min_version, "max_version": s.max_version}]}
    session.answer_locally(ev.header, registry.encode_response(ApiKey.API_VERSIONS, 0, ev.header.correlation_id,
                                                               body))


def api_versions_response(session: Session, slot: Slot, ev: ResponseEvent) -> None:
    response = registry.SUPPORTED[ApiKey.API_VERSIONS].response
    version = ev.api_version
    try:
        data = cast(ApiVersionsResponse, response.decode(ev.frame, version, ev.body_offset))
    except ProtocolError:
        version = 0  # the broker's UNSUPPORTED_VERSION answer comes as v0
        data = cast(ApiVersionsResponse, response.decode(ev.frame, 0, ev.body_offset))
    slot.chunks = _encode(ev, rewrite.cap_api_versions(data), version)


def sasl_authenticate_response(session: Session, slot: Slot, ev: ResponseEvent) -> None:
    """Relayed untouched; the mechanism's last successful round lifts the pre-authentication request limit."""
    slot.chunks = as_received(ev)
    rounds = session.sasl_rounds
    if rounds is None or not registry.supports(ev.api_key, ev.api_version):
        return
    answer = cast(SaslAuthenticateResponse, registry.decode_response(ev.api_key, ev.api_version, ev.frame,
                                                                      ev.body_offset))
    if answer["error_code"] == 0:
        if rounds <= 1:
            session.sasl_rounds = None
            session.server.frames.max_frame_size = session.proxy.settings.socket_request_max_bytes
        else:
            session.sasl_rounds = rounds - 1


def metadata_response(session: Session, slot: Slot, ev: ResponseEvent) -> None:
    data = _decode(session, slot, ev, MetadataResponse)
    if data is not None:
        session.proxy.brokers.learn(rewrite.rewrite_metadata(data, session.proxy.brokers.proxy_address))
        if session.proxy.remote is not None:  # v10+: the topics' current ids (a re-created topic has a new one)
            session.proxy.remote.learn_topic_ids(data["topics"])
        slot.chunks = _encode(ev, data)


def find_coordinator_response(session: Session, slot: Slot, ev: ResponseEvent) -> None:
    data = _decode(session, slot, ev, FindCoordinatorResponse)
    if data is not None:
        rewrite.rewrite_find_coordinator(data, ev.api_version, session.proxy.brokers.proxy_address)
        slot.chunks = _encode(ev, data)


def describe_cluster_response(session: Session, slot: Slot, ev: ResponseEvent) -> None:
    data = _decode(session, slot, ev, DescribeClusterResponse)
    if data is not None:
        session.proxy.brokers.learn(rewrite.rewrite_describe_cluster(data, session.proxy.brokers.proxy_address))
        slot.chunks = _encode(ev, data)


# SaslAuthenticate rounds until a client is authenticated, per mechanism (others: no pre-auth limit)
SASL_ROUNDS = {"PLAIN": 1, "OAUTHBEARER": 1, "SCRAM-SHA-256": 2, "SCRAM-SHA-512": 2}


def sasl_handshake_request(session: Session, ev: RequestEvent) -> None:
    """SaslHandshake v0 is followed by raw, unframed SASL tokens (clients older than Kafka 1.0) that a frame
    relay cannot carry: such a connection is closed with a log line. v1 (SaslAuthenticate frames) passes, and
    until the mechanism's last SaslAuthenticate succeeds the client's requests are limited to
    `sasl.server.max.receive.size` (as the broker limits them): an unauthenticated client cannot make the proxy
    buffer a large request."""
    if ev.header.api_version >= 1:
        mechanism = cast(SaslHandshakeRequest, registry.decode_request(ev.header, ev.frame))["mechanism"].upper()
        rounds = SASL_ROUNDS.get(mechanism)
        if rounds is not None:
            session.sasl_rounds = rounds
            frames = session.server.frames
            frames.max_frame_size = min(frames.max_frame_size, session.proxy.settings.sasl_server_max_receive_size)
        session.forward(ev)
        return
    log.warning("client %s: SaslHandshake v0 (unframed SASL tokens) is not supported, closing; use a client "
                "that authenticates with SaslAuthenticate (Kafka 1.0+)", session.peer)
    session.close()


REQUEST_HANDLERS: dict[int, RequestHandler] = {
    ApiKey.API_VERSIONS: api_versions_request,
    ApiKey.SASL_HANDSHAKE: sasl_handshake_request,
    ApiKey.FETCH: fetch.fetch_request,
    ApiKey.LIST_OFFSETS: offsets.forward_remembering_request,
    ApiKey.OFFSET_FOR_LEADER_EPOCH: offsets.forward_remembering_request,
    ApiKey.DELETE_RECORDS: offsets.forward_remembering_request,
}
RESPONSE_HANDLERS: dict[int, ResponseHandler] = {
    ApiKey.API_VERSIONS: api_versions_response,
    ApiKey.SASL_AUTHENTICATE: sasl_authenticate_response,
    ApiKey.METADATA: metadata_response,
    ApiKey.FIND_COORDINATOR: find_coordinator_response,
    ApiKey.DESCRIBE_CLUSTER: describe_cluster_response,
    ApiKey.FETCH: fetch.fetch_response,
    ApiKey.LIST_OFFSETS: offsets.list_offsets_response,
    ApiKey.DELETE_RECORDS: offsets.delete_records_response,
    ApiKey.OFFSET_FOR_LEADER_EPOCH: offsets.offset_for_leader_epoch_response,
    ApiKey.PRODUCE: relay.relay_with_endpoints,
}
