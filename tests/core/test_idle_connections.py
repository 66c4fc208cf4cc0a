"""What a connection costs the proxy while it sits (issue 65: a thousand client connections, 900 of them idle): a
client that asked what clients ask first (ApiVersions, Metadata) and then sends nothing holds a few KiB of receive
buffers on each side, not the 64 KiB a busy connection's buffer grows to."""

from __future__ import annotations

from protocol.constants import ApiKey
from tests.support.inprocess import Wire, run

IDLE_BUFFERS = 2 * 4096  # the client side's and the broker side's staging buffers as they start


def _api_versions() -> dict[str, object]:
    """A broker's ApiVersions answer of realistic size (Kafka 4 lists about 70 APIs: ~500 bytes)."""
    return {"error_code": 0, "throttle_time_ms": 0,
            "api_keys": [{"api_key": k, "min_version": 0, "max_version": 12} for k in range(75)]}


def _metadata() -> dict[str, object]:
    return {"throttle_time_ms": 0, "cluster_id": "c", "controller_id": 1,
            "brokers": [{"node_id": 1, "host": "broker.example", "port": 9092, "rack": None}],
            "topics": [{"error_code": 0, "name": "orders", "topic_id": bytes(16), "is_internal": False,
                        "partitions": [{"error_code": 0, "partition_index": p, "leader_id": 1, "leader_epoch": 0,
                                        "replica_nodes": [1], "isr_nodes": [1], "offline_replicas": []}
                                       for p in range(12)],
                        "topic_authorized_operations": -2147483648}]}


def test_a_connection_that_asked_apiversions_and_metadata_holds_small_buffers_while_it_sits() -> None:
    async def go() -> int:
        wire = Wire()
        for key, version, request, answer in (
                (ApiKey.API_VERSIONS, 3, {"client_software_name": "c", "client_software_version": "1"},
                 _api_versions()),
                (ApiKey.METADATA, 12, {"topics": [{"name": "orders", "topic_id": bytes(16)}],
                                       "allow_auto_topic_creation": False,
                                       "include_topic_authorized_operations": False}, _metadata())):
            wire.client_sends(key, version, request)
            [(header, _)] = wire.broker_receives()
            wire.broker_answers(header, answer)
            [(_, _, body)] = wire.client_receives()
            assert body is not None and body["throttle_time_ms"] == 0
        session = wire.session
        return session.server.frames.allocated() + session.upstream_conn.frames.allocated()

    assert run(go()) <= IDLE_BUFFERS
