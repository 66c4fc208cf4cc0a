"""APIs only tierproxy's own clients send (a restore, the tier job's description of the tier): Produce's request,
ListGroups (16), OffsetFetch (9), OffsetCommit (8), ElectLeaders (43), AlterPartitionReassignments (45),
InitProducerId (22: the restore's fill writes as an idempotent producer). The proxy
carries these opaque (`registry.OWN`, never `registry.SUPPORTED`): declaring them here caps no client's versions.

Wire grammar:
    ProduceRequest  => transactional_id acks timeout_ms [name [index records]]          (v9-12, flexible)
    ListGroupsRequest  => [states_filter](v4+) [types_filter](v5+)
    ListGroupsResponse => throttle_time_ms error_code [group_id protocol_type group_state(v4+) group_type(v5+)]
    OffsetFetchRequest  => [group_id [name [partition_indexes]]] require_stable               (v8, flexible)
    OffsetFetchResponse => throttle_time_ms [group_id [name [partition_index committed_offset
                           committed_leader_epoch metadata error_code]] error_code]
    OffsetCommitRequest  => group_id generation_id_or_member_epoch member_id group_instance_id
                            [name [partition_index committed_offset committed_leader_epoch committed_metadata]]
    OffsetCommitResponse => throttle_time_ms [name [partition_index error_code]]
    ElectLeadersRequest  => election_type [topic [partitions]] timeout_ms                    (v2, flexible)
        election_type: 0 PREFERRED, 1 UNCLEAN
    ElectLeadersResponse => throttle_time_ms error_code [topic [partition_id error_code error_message]]
    AlterPartitionReassignmentsRequest  => timeout_ms [name [partition_index [replicas]]]    (v0, flexible)
    AlterPartitionReassignmentsResponse => throttle_time_ms error_code error_message
                                           [name [partition_index error_code error_message]]
    InitProducerIdRequest  => transactional_id transaction_timeout_ms producer_id(v3+) producer_epoch(v3+)
                              (v4, flexible)
    InitProducerIdResponse => throttle_time_ms error_code producer_id producer_epoch
Transcribed from Apache Kafka 4.1's common/message/*.json.
"""

from __future__ import annotations

from protocol.schema import F, Message

PRODUCE_REQUEST = Message('ProduceRequest', api_key=0, versions='9-12', flexible='9+', fields=[
    F('transactional_id', 'string', '3+', nullable='3+', default=None),
    F('acks', 'int16', '0+'),
    F('timeout_ms', 'int32', '0+'),
    F('topic_data', '[]', '0+', fields=[
        F('name', 'string', '0+'),
        F('partition_data', '[]', '0+', fields=[
            F('index', 'int32', '0+'),
            F('records', 'records', '0+', nullable='0+'),
        ]),
    ]),
])

LIST_GROUPS_REQUEST = Message('ListGroupsRequest', api_key=16, versions='4-5', flexible='3+', fields=[
    F('states_filter', '[]string', '4+'),
    F('types_filter', '[]string', '5+'),
])

LIST_GROUPS_RESPONSE = Message('ListGroupsResponse', api_key=16, versions='4-5', flexible='3+', fields=[
    F('throttle_time_ms', 'int32', '1+'),
    F('error_code', 'int16', '0+'),
    F('groups', '[]', '0+', fields=[
        F('group_id', 'string', '0+'),
        F('protocol_type', 'string', '0+'),
        F('group_state', 'string', '4+'),
        F('group_type', 'string', '5+'),
    ]),
])

OFFSET_FETCH_REQUEST = Message('OffsetFetchRequest', api_key=9, versions='8', flexible='6+', fields=[
    F('groups', '[]', '8+', fields=[
        F('group_id', 'string', '8+'),
        F('topics', '[]', '8+', nullable='8+', fields=[
            F('name', 'string', '8+'),
            F('partition_indexes', '[]int32', '8+'),
        ]),
    ]),
    F('require_stable', 'bool', '7+'),
])

OFFSET_FETCH_RESPONSE = Message('OffsetFetchResponse', api_key=9, versions='8', flexible='6+', fields=[
    F('throttle_time_ms', 'int32', '3+'),
    F('groups', '[]', '8+', fields=[
        F('group_id', 'string', '8+'),
        F('topics', '[]', '8+', fields=[
            F('name', 'string', '8+'),
            F('partitions', '[]', '8+', fields=[
                F('partition_index', 'int32', '8+'),
                F('committed_offset', 'int64', '8+'),
                F('committed_leader_epoch', 'int32', '8+', default=-1),
                F('metadata', 'string', '8+', nullable='8+'),
                F('error_code', 'int16', '8+'),
            ]),
        ]),
        F('error_code', 'int16', '8+'),
    ]),
])

OFFSET_COMMIT_REQUEST = Message('OffsetCommitRequest', api_key=8, versions='8', flexible='8+', fields=[
    F('group_id', 'string', '0+'),
    F('generation_id_or_member_epoch', 'int32', '1+', default=-1),
    F('member_id', 'string', '1+'),
    F('group_instance_id', 'string', '7+', nullable='7+', default=None),
    F('topics', '[]', '0+', fields=[
        F('name', 'string', '0+'),
        F('partitions', '[]', '0+', fields=[
            F('partition_index', 'int32', '0+'),
            F('committed_offset', 'int64', '0+'),
            F('committed_leader_epoch', 'int32', '6+', default=-1),
            F('committed_metadata', 'string', '0+', nullable='0+'),
        ]),
    ]),
])

OFFSET_COMMIT_RESPONSE = Message('OffsetCommitResponse', api_key=8, versions='8', flexible='8+', fields=[
    F('throttle_time_ms', 'int32', '3+'),
    F('topics', '[]', '0+', fields=[
        F('name', 'string', '0+'),
        F('partitions', '[]', '0+', fields=[
            F('partition_index', 'int32', '0+'),
            F('error_code', 'int16', '0+'),
        ]),
    ]),
])

ELECT_LEADERS_REQUEST = Message('ElectLeadersRequest', api_key=43, versions='2', flexible='2+', fields=[
    F('election_type', 'int8', '1+'),
    F('topic_partitions', '[]', '0+', nullable='0+', fields=[
        F('topic', 'string', '0+'),
        F('partitions', '[]int32', '0+'),
    ]),
    F('timeout_ms', 'int32', '0+'),
])

ELECT_LEADERS_RESPONSE = Message('ElectLeadersResponse', api_key=43, versions='2', flexible='2+', fields=[
    F('throttle_time_ms', 'int32', '0+'),
    F('error_code', 'int16', '1+'),
    F('replica_election_results', '[]', '0+', fields=[
        F('topic', 'string', '0+'),
        F('partition_result', '[]', '0+', fields=[
            F('partition_id', 'int32', '0+'),
            F('error_code', 'int16', '0+'),
            F('error_message', 'string', '0+', nullable='0+'),
        ]),
    ]),
])

ALTER_PARTITION_REASSIGNMENTS_REQUEST = Message('AlterPartitionReassignmentsRequest', api_key=45, versions='0',
                                                flexible='0+', fields=[
    F('timeout_ms', 'int32', '0+'),
    F('topics', '[]', '0+', fields=[
        F('name', 'string', '0+'),
        F('partitions', '[]', '0+', fields=[
            F('partition_index', 'int32', '0+'),
            F('replicas', '[]int32', '0+', nullable='0+'),
        ]),
    ]),
])

ALTER_PARTITION_REASSIGNMENTS_RESPONSE = Message('AlterPartitionReassignmentsResponse', api_key=45, versions='0',
                                                 flexible='0+', fields=[
    F('throttle_time_ms', 'int32', '0+'),
    F('error_code', 'int16', '0+'),
    F('error_message', 'string', '0+', nullable='0+'),
    F('responses', '[]', '0+', fields=[
        F('name', 'string', '0+'),
        F('partitions', '[]', '0+', fields=[
            F('partition_index', 'int32', '0+'),
            F('error_code', 'int16', '0+'),
            F('error_message', 'string', '0+', nullable='0+'),
        ]),
    ]),
])

INIT_PRODUCER_ID_REQUEST = Message('InitProducerIdRequest', api_key=22, versions='4', flexible='2+', fields=[
    F('transactional_id', 'string', '0+', nullable='0+', default=None),
    F('transaction_timeout_ms', 'int32', '0+'),
    F('producer_id', 'int64', '3+', default=-1),
    F('producer_epoch', 'int16', '3+', default=-1),
])

INIT_PRODUCER_ID_RESPONSE = Message('InitProducerIdResponse', api_key=22, versions='4', flexible='2+', fields=[
    F('throttle_time_ms', 'int32', '0+'),
    F('error_code', 'int16', '0+'),
    F('producer_id', 'int64', '0+', default=-1),
    F('producer_epoch', 'int16', '0+'),
])
