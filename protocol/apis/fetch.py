"""Fetch (1), versions 4-18.

Wire grammar:
    FetchRequest  => cluster_id(tag 0, v12+) replica_id(v0-14) replica_state(tag 1, v15+) max_wait_ms min_bytes
                     max_bytes isolation_level session_id(v7+) session_epoch(v7+)
                     [topic(v0-12) | topic_id(v13+)
                      [partition current_leader_epoch(v9+) fetch_offset last_fetched_epoch(v12+)
                       log_start_offset partition_max_bytes replica_directory_id(tag 0, v17+)
                       high_watermark(tag 1, v18+)]]
                     [forgotten topic|topic_id [partitions]](v7+) rack_id(v11+)
    FetchResponse => throttle_time_ms error_code(v7+) session_id(v7+)
                     [topic(v0-12) | topic_id(v13+)
                      [partition_index error_code high_watermark last_stable_offset log_start_offset
                       diverging_epoch(tag 0) current_leader(tag 1) snapshot_id(tag 2)
                       [producer_id first_offset] (aborted_transactions, nullable)
                       preferred_read_replica(v11+) records (nullable; compact from v12)]]
                     node_endpoints(tag 0, v16+: [node_id host port rack])
Transcribed from Apache Kafka 4.1's common/message/*.json.
"""

from __future__ import annotations

from protocol.schema import F, Message

FETCH_REQUEST = Message('FetchRequest', api_key=1, versions='4-18', flexible='12+', fields=[
    F('cluster_id', 'string', '12+', nullable='12+', tag=0, default=None),
    F('replica_id', 'int32', '0-14', default=-1),
    F('replica_state', '{}', '15+', tag=1, fields=[
        F('replica_id', 'int32', '15+', default=-1),
        F('replica_epoch', 'int64', '15+', default=-1),
    ]),
    F('max_wait_ms', 'int32', '0+'),
    F('min_bytes', 'int32', '0+'),
    F('max_bytes', 'int32', '3+', default=2147483647),
    F('isolation_level', 'int8', '4+', default=0),
    F('session_id', 'int32', '7+', default=0),
    F('session_epoch', 'int32', '7+', default=-1),
    F('topics', '[]', '0+', fields=[
        F('topic', 'string', '0-12'),
        F('topic_id', 'uuid', '13+'),
        F('partitions', '[]', '0+', fields=[
            F('partition', 'int32', '0+'),
            F('current_leader_epoch', 'int32', '9+', default=-1),
            F('fetch_offset', 'int64', '0+'),
            F('last_fetched_epoch', 'int32', '12+', default=-1),
            F('log_start_offset', 'int64', '5+', default=-1),
            F('partition_max_bytes', 'int32', '0+'),
            F('replica_directory_id', 'uuid', '17+', tag=0),
            F('high_watermark', 'int64', '18+', tag=1, default=9223372036854775807),
        ]),
    ]),
    F('forgotten_topics_data', '[]', '7+', fields=[
        F('topic', 'string', '7-12'),
        F('topic_id', 'uuid', '13+'),
        F('partitions', '[]int32', '7+'),
    ]),
    F('rack_id', 'string', '11+', default=''),
])

FETCH_RESPONSE = Message('FetchResponse', api_key=1, versions='4-18', flexible='12+', fields=[
    F('throttle_time_ms', 'int32', '1+'),
    F('error_code', 'int16', '7+'),
    F('session_id', 'int32', '7+', default=0),
    F('responses', '[]', '0+', fields=[
        F('topic', 'string', '0-12'),
        F('topic_id', 'uuid', '13+'),
        F('partitions', '[]', '0+', fields=[
            F('partition_index', 'int32', '0+'),
            F('error_code', 'int16', '0+'),
            F('high_watermark', 'int64', '0+'),
            F('last_stable_offset', 'int64', '4+', default=-1),
            F('log_start_offset', 'int64', '5+', default=-1),
            F('diverging_epoch', '{}', '12+', tag=0, fields=[
                F('epoch', 'int32', '12+', default=-1),
                F('end_offset', 'int64', '12+', default=-1),
            ]),
            F('current_leader', '{}', '12+', tag=1, fields=[
                F('leader_id', 'int32', '12+', default=-1),
                F('leader_epoch', 'int32', '12+', default=-1),
            ]),
            F('snapshot_id', '{}', '12+', tag=2, fields=[
                F('end_offset', 'int64', '0+', default=-1),
                F('epoch', 'int32', '0+', default=-1),
            ]),
            F('aborted_transactions', '[]', '4+', nullable='4+', fields=[
                F('producer_id', 'int64', '4+'),
                F('first_offset', 'int64', '4+'),
            ]),
            F('preferred_read_replica', 'int32', '11+', default=-1),
            F('records', 'records', '0+', nullable='0+'),
        ]),
    ]),
    F('node_endpoints', '[]', '16+', tag=0, fields=[
        F('node_id', 'int32', '16+'),
        F('host', 'string', '16+'),
        F('port', 'int32', '16+'),
        F('rack', 'string', '16+', nullable='16+', default=None),
    ]),
])

