"""Discovery APIs: ApiVersions (18), Metadata (3), FindCoordinator (10), DescribeCluster (60).

Wire grammar (non-flexible / flexible encodings per primitives.py; tagged fields close every flexible struct):
    ApiVersionsRequest  => [client_software_name client_software_version]v3+
    ApiVersionsResponse => error_code [api_key min_version max_version] throttle_time_ms(v1+)
                           tagged: 0 supported_features, 1 finalized_features_epoch, 2 finalized_features
    MetadataRequest     => [topic_id(v10+) name] allow_auto_topic_creation(v4+) include_*_authorized_operations
    MetadataResponse    => throttle_time_ms(v3+) [node_id host port rack(v1+)] cluster_id(v2+) controller_id(v1+)
                           [error_code name topic_id(v10+) is_internal(v1+) [partition...] topic_auth_ops(v8+)]
                           cluster_auth_ops(v8-10) error_code(v13+)
    FindCoordinatorRequest  => key(v0-3) key_type(v1+) [coordinator_keys](v4+)
    FindCoordinatorResponse => throttle(v1+) error_code error_message node_id host port (v0-3)
                               | [key node_id host port error_code error_message] (v4+)
    DescribeClusterRequest  => include_cluster_authorized_operations endpoint_type(v1+) include_fenced(v2+)
    DescribeClusterResponse => throttle error_code error_message endpoint_type(v1+) cluster_id controller_id
                               [broker_id host port rack is_fenced(v2+)] cluster_authorized_operations
Transcribed from Apache Kafka 4.1's common/message/*.json.
"""

from __future__ import annotations

from protocol.schema import F, Message

API_VERSIONS_REQUEST = Message('ApiVersionsRequest', api_key=18, versions='0-4', flexible='3+', fields=[
    F('client_software_name', 'string', '3+'),
    F('client_software_version', 'string', '3+'),
])

API_VERSIONS_RESPONSE = Message('ApiVersionsResponse', api_key=18, versions='0-4', flexible='3+', fields=[
    F('error_code', 'int16', '0+'),
    F('api_keys', '[]', '0+', fields=[
        F('api_key', 'int16', '0+'),
        F('min_version', 'int16', '0+'),
        F('max_version', 'int16', '0+'),
    ]),
    F('throttle_time_ms', 'int32', '1+'),
    F('supported_features', '[]', '3+', tag=0, fields=[
        F('name', 'string', '3+'),
        F('min_version', 'int16', '3+'),
        F('max_version', 'int16', '3+'),
    ]),
    F('finalized_features_epoch', 'int64', '3+', tag=1, default=-1),
    F('finalized_features', '[]', '3+', tag=2, fields=[
        F('name', 'string', '3+'),
        F('max_version_level', 'int16', '3+'),
        F('min_version_level', 'int16', '3+'),
    ]),
    F('zk_migration_ready', 'bool', '3+', tag=3, default=False),
])

METADATA_REQUEST = Message('MetadataRequest', api_key=3, versions='0-13', flexible='9+', fields=[
    F('topics', '[]', '0+', nullable='1+', fields=[
        F('topic_id', 'uuid', '10+'),
        F('name', 'string', '0+', nullable='10+'),
    ]),
    F('allow_auto_topic_creation', 'bool', '4+', default=True),
    F('include_cluster_authorized_operations', 'bool', '8-10'),
    F('include_topic_authorized_operations', 'bool', '8+'),
])

METADATA_RESPONSE = Message('MetadataResponse', api_key=3, versions='0-13', flexible='9+', fields=[
    F('throttle_time_ms', 'int32', '3+'),
    F('brokers', '[]', '0+', fields=[
        F('node_id', 'int32', '0+'),
        F('host', 'string', '0+'),
        F('port', 'int32', '0+'),
        F('rack', 'string', '1+', nullable='1+', default=None),
    ]),
    F('cluster_id', 'string', '2+', nullable='2+', default=None),
    F('controller_id', 'int32', '1+', default=-1),
    F('topics', '[]', '0+', fields=[
        F('error_code', 'int16', '0+'),
        F('name', 'string', '0+', nullable='12+'),
        F('topic_id', 'uuid', '10+'),
        F('is_internal', 'bool', '1+', default=False),
        F('partitions', '[]', '0+', fields=[
            F('error_code', 'int16', '0+'),
            F('partition_index', 'int32', '0+'),
            F('leader_id', 'int32', '0+'),
            F('leader_epoch', 'int32', '7+', default=-1),
            F('replica_nodes', '[]int32', '0+'),
            F('isr_nodes', '[]int32', '0+'),
            F('offline_replicas', '[]int32', '5+'),
        ]),
        F('topic_authorized_operations', 'int32', '8+', default=-2147483648),
    ]),
    F('cluster_authorized_operations', 'int32', '8-10', default=-2147483648),
    F('error_code', 'int16', '13+'),
])

FIND_COORDINATOR_REQUEST = Message('FindCoordinatorRequest', api_key=10, versions='0-6', flexible='3+', fields=[
    F('key', 'string', '0-3'),
    F('key_type', 'int8', '1+', default=0),
    F('coordinator_keys', '[]string', '4+'),
])

FIND_COORDINATOR_RESPONSE = Message('FindCoordinatorResponse', api_key=10, versions='0-6', flexible='3+', fields=[
    F('throttle_time_ms', 'int32', '1+'),
    F('error_code', 'int16', '0-3'),
    F('error_message', 'string', '1-3', nullable='1-3'),
    F('node_id', 'int32', '0-3'),
    F('host', 'string', '0-3'),
    F('port', 'int32', '0-3'),
    F('coordinators', '[]', '4+', fields=[
        F('key', 'string', '4+'),
        F('node_id', 'int32', '4+'),
        F('host', 'string', '4+'),
        F('port', 'int32', '4+'),
        F('error_code', 'int16', '4+'),
        F('error_message', 'string', '4+', nullable='4+'),
    ]),
])

DESCRIBE_CLUSTER_REQUEST = Message('DescribeClusterRequest', api_key=60, versions='0-2', flexible='0+', fields=[
    F('include_cluster_authorized_operations', 'bool', '0+'),
    F('endpoint_type', 'int8', '1+', default=1),
    F('include_fenced_brokers', 'bool', '2+'),
])

DESCRIBE_CLUSTER_RESPONSE = Message('DescribeClusterResponse', api_key=60, versions='0-2', flexible='0+', fields=[
    F('throttle_time_ms', 'int32', '0+'),
    F('error_code', 'int16', '0+'),
    F('error_message', 'string', '0+', nullable='0+', default=None),
    F('endpoint_type', 'int8', '1+', default=1),
    F('cluster_id', 'string', '0+'),
    F('controller_id', 'int32', '0+', default=-1),
    F('brokers', '[]', '0+', fields=[
        F('broker_id', 'int32', '0+'),
        F('host', 'string', '0+'),
        F('port', 'int32', '0+'),
        F('rack', 'string', '0+', nullable='0+', default=None),
        F('is_fenced', 'bool', '2+'),
    ]),
    F('cluster_authorized_operations', 'int32', '0+', default=-2147483648),
])

