"""Produce (0): the response is decoded (KIP-951 NodeEndpoints, v10+); the request stays opaque except acks.

Wire grammar:
    ProduceRequest  => transactional_id acks timeout_ms [topic [partition records]]   (only acks is read)
    ProduceResponse => [name(v0-12) | topic_id(v13+) [index error_code base_offset log_append_time_ms
                        log_start_offset [batch_index batch_index_error_message] error_message
                        current_leader(tag 0)]] throttle_time_ms node_endpoints(tag 0, v10+)
Transcribed from Apache Kafka 4.1's common/message/*.json.
"""

from __future__ import annotations

from protocol.errors import ProtocolError
from protocol.primitives import Reader
from protocol.schema import F, Message

PRODUCE_FLEXIBLE_FROM = 9


def produce_acks(body: memoryview, version: int, pos: int = 0) -> int:
    """The `acks` of a Produce request body (acks=0 means the broker sends no response)."""
    r = Reader(body, pos)
    if version >= PRODUCE_FLEXIBLE_FROM:
        r.compact_nullable_string()
    else:
        r.nullable_string()
    acks = r.int16()
    if acks not in (-1, 0, 1):
        raise ProtocolError(f"bad acks {acks}", api_key=0, api_version=version, field="acks")
    return acks

PRODUCE_RESPONSE = Message('ProduceResponse', api_key=0, versions='3-13', flexible='9+', fields=[
    F('responses', '[]', '0+', fields=[
        F('name', 'string', '0-12'),
        F('topic_id', 'uuid', '13+'),
        F('partition_responses', '[]', '0+', fields=[
            F('index', 'int32', '0+'),
            F('error_code', 'int16', '0+'),
            F('base_offset', 'int64', '0+'),
            F('log_append_time_ms', 'int64', '2+', default=-1),
            F('log_start_offset', 'int64', '5+', default=-1),
            F('record_errors', '[]', '8+', fields=[
                F('batch_index', 'int32', '8+'),
                F('batch_index_error_message', 'string', '8+', nullable='8+', default=None),
            ]),
            F('error_message', 'string', '8+', nullable='8+', default=None),
            F('current_leader', '{}', '10+', tag=0, fields=[
                F('leader_id', 'int32', '10+', default=-1),
                F('leader_epoch', 'int32', '10+', default=-1),
            ]),
        ]),
    ]),
    F('throttle_time_ms', 'int32', '1+', default=0),
    F('node_endpoints', '[]', '10+', tag=0, fields=[
        F('node_id', 'int32', '10+'),
        F('host', 'string', '10+'),
        F('port', 'int32', '10+'),
        F('rack', 'string', '10+', nullable='10+', default=None),
    ]),
])

