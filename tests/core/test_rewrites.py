"""Every response rewrite of the proxy core, in process: a real Session and the real handlers between a scripted
client and a scripted broker, at every version the codec supports. Clients must only ever see proxy addresses
(advertised host, port base + node id); everything else passes byte for byte."""

from __future__ import annotations

from typing import Any

import pytest

from protocol import registry
from protocol.constants import ApiKey, ErrorCode
from protocol.headers import RequestHeader
from protocol.requests import fetch_request
from tests.support.inprocess import ADVERTISED, PORT_BASE, Wire, run
from tests.support.samples import normalize, projected, sample

Data = dict[str, Any]


def versions(key: ApiKey) -> range:
    s = registry.SUPPORTED[key]
    return range(s.min_version, s.max_version + 1)


def exchange(key: ApiKey, version: int, request: Data, response: Data) -> tuple[Wire, Data]:
    """One request through the session, the broker's response back: (the wire, what the client decoded)."""
    async def go() -> tuple[Wire, Data]:
        wire = Wire()
        header = wire.client_sends(key, version, request)
        [(got, _)] = wire.broker_receives()
        assert got.correlation_id == header.correlation_id
        wire.broker_answers(got, response)
        [(cid, _, body)] = wire.client_receives()
        assert cid == header.correlation_id and body is not None
        return wire, body

    result: tuple[Wire, Data] = run(go())
    return result


def proxied(node_id: int) -> tuple[str, int]:
    return ADVERTISED, PORT_BASE + node_id


@pytest.mark.parametrize("version", versions(ApiKey.METADATA))
def test_metadata_brokers_become_proxy_addresses(version: int) -> None:
    response = sample(registry.SUPPORTED[ApiKey.METADATA].response, version)
    response["brokers"] = [{**b, "node_id": i, "host": f"kafka-{i}.internal", "port": 9092 + i}
                           for i, b in enumerate(response["brokers"])]
    wire, got = exchange(ApiKey.METADATA, version, sample(registry.SUPPORTED[ApiKey.METADATA].request, version),
                         response)
    assert [(b["host"], b["port"]) for b in got["brokers"]] == [proxied(i) for i in range(len(response["brokers"]))]
    assert wire.proxy.brokers.upstream == {i: (f"kafka-{i}.internal", 9092 + i) for i in range(len(got["brokers"]))}
    assert projected(got["topics"], response["topics"]) == normalize(response["topics"])  # only addresses changed


@pytest.mark.parametrize("version", versions(ApiKey.FIND_COORDINATOR))
def test_find_coordinator_answers_name_the_proxy(version: int) -> None:
    message = registry.SUPPORTED[ApiKey.FIND_COORDINATOR]
    response = sample(message.response, version)
    if version >= 4:
        response["coordinators"] = [
            {**response["coordinators"][0], "node_id": 3, "host": "kafka-3.internal", "port": 19092},
            {**response["coordinators"][0], "node_id": -1, "host": "", "port": -1,
             "error_code": ErrorCode.COORDINATOR_NOT_AVAILABLE}]
    else:
        response.update(node_id=3, host="kafka-3.internal", port=19092)
    _, got = exchange(ApiKey.FIND_COORDINATOR, version, sample(message.request, version), response)
    if version >= 4:
        assert [(c["node_id"], c["host"], c["port"]) for c in got["coordinators"]] == [
            (3, *proxied(3)), (-1, "", -1)]  # an error entry keeps its empty address
    else:
        assert (got["host"], got["port"]) == proxied(3)


@pytest.mark.parametrize(("version", "endpoint_type"),
                         [(v, t) for v in versions(ApiKey.DESCRIBE_CLUSTER) for t in (1, 2) if v >= 1 or t == 1])
def test_describe_cluster_rewrites_brokers_never_controllers(version: int, endpoint_type: int) -> None:
    message = registry.SUPPORTED[ApiKey.DESCRIBE_CLUSTER]
    response = sample(message.response, version)
    response["brokers"] = [{**b, "broker_id": i, "host": f"kafka-{i}.internal", "port": 9092}
                           for i, b in enumerate(response["brokers"])]
    if version >= 1:
        response["endpoint_type"] = endpoint_type
    _, got = exchange(ApiKey.DESCRIBE_CLUSTER, version, sample(message.request, version), response)
    addresses = [(b["host"], b["port"]) for b in got["brokers"]]
    if endpoint_type == 1:
        assert addresses == [proxied(i) for i in range(len(addresses))]
    else:  # controllers are not proxied (their ids may clash with brokers' in combined mode)
        assert addresses == [(f"kafka-{i}.internal", 9092) for i in range(len(addresses))]


@pytest.mark.parametrize("version", versions(ApiKey.FETCH))
def test_fetch_node_endpoints_are_rewritten_and_other_responses_pass_byte_for_byte(version: int) -> None:
    message = registry.SUPPORTED[ApiKey.FETCH]
    for with_endpoints in (True, False):
        response = sample(message.response, version)
        if version >= 16:
            response["node_endpoints"] = [{"node_id": 2, "host": "kafka-2.internal", "port": 9094, "rack": None}
                                          ] if with_endpoints else []

        async def go(response: Data = response) -> tuple[bytes, bytes, Data | None]:
            wire = Wire()
            wire.client_sends(ApiKey.FETCH, version, fetch_request({"t": {0: 5}}, max_bytes=1 << 20)
                              | ({"topics": [{"topic_id": b"\x01" * 16, "partitions": [
                                  {"partition": 0, "fetch_offset": 5, "partition_max_bytes": 1 << 20}]}]}
                                 if version >= 13 else {}))
            [(got, _)] = wire.broker_receives()
            raw = registry.joined(registry.encode_response(ApiKey.FETCH, version, got.correlation_id,
                                                                      response))
            wire.broker_answers(got, raw)
            [(_, frame, body)] = wire.client_receives()
            return raw[4:], frame, body

        sent, frame, body = run(go())
        assert body is not None
        if version >= 16 and with_endpoints:
            assert [(e["host"], e["port"]) for e in body["node_endpoints"]] == [proxied(2)]
        else:
            assert frame == sent  # nothing to rewrite: the broker's bytes, untouched


@pytest.mark.parametrize("version", [v for v in versions(ApiKey.PRODUCE) if v >= 10])
def test_produce_node_endpoints_are_rewritten(version: int) -> None:
    message = registry.SUPPORTED[ApiKey.PRODUCE]
    response = sample(message.response, version)
    response["node_endpoints"] = [{"node_id": 7, "host": "kafka-7.internal", "port": 9099, "rack": "r1"}]

    async def go() -> Data | None:
        wire = Wire()
        # Produce requests are opaque to the codec: a minimal v3+ body with acks=1 (a response is expected)
        header = RequestHeader(ApiKey.PRODUCE, version, 1, "p", 2, 0)
        body = header.encode() + b"\x00" + (1).to_bytes(2, "big", signed=True) + (1000).to_bytes(4, "big") + b"\x01\x00"
        wire.client_sends_raw(header, len(body).to_bytes(4, "big") + body)
        [(got, _)] = wire.broker_receives()
        wire.broker_answers(got, response)
        [(_, _, decoded)] = wire.client_receives()
        return decoded

    got = run(go())
    assert got is not None and [(e["host"], e["port"], e["rack"]) for e in got["node_endpoints"]] == [
        (*proxied(7), "r1")]


def test_api_versions_are_capped_to_what_the_codec_reads() -> None:
    response = {"error_code": 0, "throttle_time_ms": 0, "api_keys": [
        {"api_key": ApiKey.FETCH, "min_version": 0, "max_version": 99},
        {"api_key": ApiKey.PRODUCE, "min_version": 0, "max_version": 99},
        {"api_key": ApiKey.CREATE_TOPICS, "min_version": 2, "max_version": 99}]}
    _, got = exchange(ApiKey.API_VERSIONS, 3, {"client_software_name": "t", "client_software_version": "1"},
                      response)
    fetch, produce = registry.SUPPORTED[ApiKey.FETCH], registry.SUPPORTED[ApiKey.PRODUCE]
    assert [(k["api_key"], k["min_version"], k["max_version"]) for k in got["api_keys"]] == [
        (ApiKey.FETCH, fetch.min_version, fetch.max_version),  # intercepted: the codec's whole range
        (ApiKey.PRODUCE, 0, produce.max_version),  # the broker's minimum (old versions stay opaque)
        (ApiKey.CREATE_TOPICS, 2, 99)]  # not intercepted: as the broker says


def test_api_versions_beyond_the_codec_are_answered_locally_as_a_broker_would() -> None:
    async def go() -> tuple[list[Any], list[Any]]:
        wire = Wire()
        header = RequestHeader(ApiKey.API_VERSIONS, 99, 41, "new-client", 2, 0)
        body = header.encode() + b"\x00"
        wire.client_sends_raw(header, len(body).to_bytes(4, "big") + body)
        broker_got = wire.broker_receives()
        wire._client_conn._in_flight[-1].api_version = 0  # a v0 UNSUPPORTED_VERSION answer, as Kafka gives
        return broker_got, wire.client_receives()

    broker_got, client_got = run(go())
    assert broker_got == []
    [(cid, _, body)] = client_got
    s = registry.SUPPORTED[ApiKey.API_VERSIONS]
    assert cid == 41 and body is not None and body["error_code"] == ErrorCode.UNSUPPORTED_VERSION
    assert body["api_keys"] == [{"api_key": ApiKey.API_VERSIONS, "min_version": s.min_version,
                                 "max_version": s.max_version}]


def test_an_api_the_proxy_does_not_intercept_passes_byte_for_byte_in_order() -> None:
    async def go() -> tuple[list[Any], list[Any], bytes, bytes]:
        wire = Wire()
        first = RequestHeader(ApiKey.CREATE_TOPICS, 7, 100, "admin", 2, 0)
        req = first.encode() + b"\x01opaque-body"
        wire.client_sends_raw(first, len(req).to_bytes(4, "big") + req)
        wire.client_sends(ApiKey.METADATA, 12, sample(registry.SUPPORTED[ApiKey.METADATA].request, 12))
        got = wire.broker_receives()
        answer = (100).to_bytes(4, "big") + b"\x00opaque-answer"  # correlation id, tagged fields, body
        md = sample(registry.SUPPORTED[ApiKey.METADATA].response, 12)
        md["brokers"] = []
        wire.broker_answers(got[0][0], len(answer).to_bytes(4, "big") + answer)
        wire.broker_answers(got[1][0], md)
        return got, wire.client_receives(), req, answer

    got, back, req, answer = run(go())
    assert got[0][1] == req  # the request, untouched
    assert [cid for cid, _, _ in back] == [100, 1]  # answered in request order
    assert back[0][1] == answer and back[0][2] is None  # the response, untouched
