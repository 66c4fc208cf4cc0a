"""Offset APIs: ListOffsets (2), DeleteRecords (21) and OffsetForLeaderEpoch (23).

Wire grammar:
    ListOffsetsRequest  => replica_id isolation_level(v2+) [name [partition_index current_leader_epoch(v4+)
                           timestamp]] timeout_ms(v10+)
        timestamp: -1 LATEST, -2 EARLIEST, -3 MAX_TIMESTAMP (v7+), -4 EARLIEST_LOCAL (v8+),
                   -5 LATEST_TIERED (v9+), >= 0 the first offset whose timestamp is >= it
    ListOffsetsResponse => throttle_time_ms(v2+) [name [partition_index error_code timestamp offset
                           leader_epoch(v4+)]]
    DeleteRecordsRequest  => [name [partition_index offset]] timeout_ms
        offset: the new log start offset; -1 the high watermark
    DeleteRecordsResponse => throttle_time_ms [name [partition_index low_watermark error_code]]
    OffsetForLeaderEpochRequest  => replica_id(v3+) [topic [partition current_leader_epoch leader_epoch]]
    OffsetForLeaderEpochResponse => throttle_time_ms [topic [error_code partition leader_epoch end_offset]]
Transcribed from Apache Kafka 4.1's common/message/*.json.
"""

from __future__ import annotations

from protocol.schema import F, Message

LIST_OFFSETS_REQUEST = Message('ListOffsetsRequest', api_key=2, versions='1-10', flexible='6+', fields=[
    F('replica_id', 'int32', '0+'),
    F('isolation_level', 'int8', '2+'),
    F('topics', '[]', '0+', fields=[
        F('name', 'string', '0+'),
        F('partitions', '[]', '0+', fields=[
            F('partition_index', 'int32', '0+'),
            F('current_leader_epoch', 'int32', '4+', default=-1),
            F('timestamp', 'int64', '0+'),
        ]),
    ]),
    F('timeout_ms', 'int32', '10+'),
])

LIST_OFFSETS_RESPONSE = Message('ListOffsetsResponse', api_key=2, versions='1-10', flexible='6+', fields=[
    F('throttle_time_ms', 'int32', '2+'),
    F('topics', '[]', '0+', fields=[
        F('name', 'string', '0+'),
        F('partitions', '[]', '0+', fields=[
            F('partition_index', 'int32', '0+'),
            F('error_code', 'int16', '0+'),
            F('timestamp', 'int64', '1+', default=-1),
            F('offset', 'int64', '1+', default=-1),
            F('leader_epoch', 'int32', '4+', default=-1),
        ]),
    ]),
])

DELETE_RECORDS_REQUEST = Message('DeleteRecordsRequest', api_key=21, versions='0-2', flexible='2+', fields=[
    F('topics', '[]', '0+', fields=[
        F('name', 'string', '0+'),
        F('partitions', '[]', '0+', fields=[
            F('partition_index', 'int32', '0+'),
            F('offset', 'int64', '0+'),
        ]),
    ]),
    F('timeout_ms', 'int32', '0+'),
])

DELETE_RECORDS_RESPONSE = Message('DeleteRecordsResponse', api_key=21, versions='0-2', flexible='2+', fields=[
    F('throttle_time_ms', 'int32', '0+'),
    F('topics', '[]', '0+', fields=[
        F('name', 'string', '0+'),
        F('partitions', '[]', '0+', fields=[
            F('partition_index', 'int32', '0+'),
            F('low_watermark', 'int64', '0+'),
            F('error_code', 'int16', '0+'),
        ]),
    ]),
])

OFFSET_FOR_LEADER_EPOCH_REQUEST = Message('OffsetForLeaderEpochRequest', api_key=23, versions='2-4', flexible='4+',
                                            fields=[
    F('replica_id', 'int32', '3+', default=-2),
    F('topics', '[]', '0+', fields=[
        F('topic', 'string', '0+'),
        F('partitions', '[]', '0+', fields=[
            F('partition', 'int32', '0+'),
            F('current_leader_epoch', 'int32', '2+', default=-1),
            F('leader_epoch', 'int32', '0+'),
        ]),
    ]),
])

OFFSET_FOR_LEADER_EPOCH_RESPONSE = Message('OffsetForLeaderEpochResponse', api_key=23, versions='2-4', flexible='4+',
                                            fields=[
    F('throttle_time_ms', 'int32', '2+'),
    F('topics', '[]', '0+', fields=[
        F('topic', 'string', '0+'),
        F('partitions', '[]', '0+', fields=[
            F('error_code', 'int16', '0+'),
            F('partition', 'int32', '0+'),
            F('leader_epoch', 'int32', '1+', default=-1),
            F('end_offset', 'int64', '0+', default=-1),
        ]),
    ]),
])
