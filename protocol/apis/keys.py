"""Every API key Kafka 4.1 defines: its name and first flexible request version (None = never flexible).

The request header version follows from it: v2 (client_id + tagged fields) for flexible versions, else v1.
Transcribed from Apache Kafka 4.1's common/message/*Request.json; the comment gives the valid versions.
"""

from __future__ import annotations

API_KEYS: dict[int, tuple[str, int | None]] = {
    0: ('Produce', 9),  # v3-13 broker
    1: ('Fetch', 12),  # v4-18 broker,controller
    2: ('ListOffsets', 6),  # v1-10 broker
    3: ('Metadata', 9),  # v0-13 broker
    4: ('LeaderAndIsr', None),  # v-1--1
    5: ('StopReplica', None),  # v-1--1
    6: ('UpdateMetadata', None),  # v-1--1
    7: ('ControlledShutdown', None),  # v-1--1
    8: ('OffsetCommit', 8),  # v2-10 broker
    9: ('OffsetFetch', 6),  # v1-10 broker
    10: ('FindCoordinator', 3),  # v0-6 broker
    11: ('JoinGroup', 6),  # v0-9 broker
    12: ('Heartbeat', 4),  # v0-4 broker
    13: ('LeaveGroup', 4),  # v0-5 broker
    14: ('SyncGroup', 4),  # v0-5 broker
    15: ('DescribeGroups', 5),  # v0-6 broker
    16: ('ListGroups', 3),  # v0-5 broker
    17: ('SaslHandshake', None),  # v0-1 broker,controller
    18: ('ApiVersions', 3),  # v0-4 broker,controller
    19: ('CreateTopics', 5),  # v2-7 broker,controller
    20: ('DeleteTopics', 4),  # v1-6 broker,controller
    21: ('DeleteRecords', 2),  # v0-2 broker
    22: ('InitProducerId', 2),  # v0-6 broker
    23: ('OffsetForLeaderEpoch', 4),  # v2-4 broker
    24: ('AddPartitionsToTxn', 3),  # v0-5 broker
    25: ('AddOffsetsToTxn', 3),  # v0-4 broker
    26: ('EndTxn', 3),  # v0-5 broker
    27: ('WriteTxnMarkers', 1),  # v1-1 broker
    28: ('TxnOffsetCommit', 3),  # v0-5 broker
    29: ('DescribeAcls', 2),  # v1-3 broker,controller
    30: ('CreateAcls', 2),  # v1-3 broker,controller
    31: ('DeleteAcls', 2),  # v1-3 broker,controller
    32: ('DescribeConfigs', 4),  # v1-4 broker,controller
    33: ('AlterConfigs', 2),  # v0-2 broker,controller
    34: ('AlterReplicaLogDirs', 2),  # v1-2 broker
    35: ('DescribeLogDirs', 2),  # v1-4 broker
    36: ('SaslAuthenticate', 2),  # v0-2 broker,controller
    37: ('CreatePartitions', 2),  # v0-3 broker,controller
    38: ('CreateDelegationToken', 2),  # v1-3 broker,controller
    39: ('RenewDelegationToken', 2),  # v1-2 broker,controller
    40: ('ExpireDelegationToken', 2),  # v1-2 broker,controller
    41: ('DescribeDelegationToken', 2),  # v1-3 broker,controller
    42: ('DeleteGroups', 2),  # v0-2 broker
    43: ('ElectLeaders', 2),  # v0-2 broker,controller
    44: ('IncrementalAlterConfigs', 1),  # v0-1 broker,controller
    45: ('AlterPartitionReassignments', 0),  # v0-1 broker,controller
    46: ('ListPartitionReassignments', 0),  # v0-0 broker,controller
    47: ('OffsetDelete', None),  # v0-0 broker
    48: ('DescribeClientQuotas', 1),  # v0-1 broker
    49: ('AlterClientQuotas', 1),  # v0-1 broker,controller
    50: ('DescribeUserScramCredentials', 0),  # v0-0 broker,controller
    51: ('AlterUserScramCredentials', 0),  # v0-0 broker,controller
    52: ('Vote', 0),  # v0-2 controller
    53: ('BeginQuorumEpoch', 1),  # v0-1 controller
    54: ('EndQuorumEpoch', 1),  # v0-1 controller
    55: ('DescribeQuorum', 0),  # v0-2 broker,controller
    56: ('AlterPartition', 0),  # v2-3 controller
    57: ('UpdateFeatures', 0),  # v0-2 broker,controller
    58: ('Envelope', 0),  # v0-0 controller
    59: ('FetchSnapshot', 0),  # v0-1 controller
    60: ('DescribeCluster', 0),  # v0-2 broker,controller
    61: ('DescribeProducers', 0),  # v0-0 broker
    62: ('BrokerRegistration', 0),  # v0-4 controller
    63: ('BrokerHeartbeat', 0),  # v0-1 controller
    64: ('UnregisterBroker', 0),  # v0-0 broker,controller
    65: ('DescribeTransactions', 0),  # v0-0 broker
    66: ('ListTransactions', 0),  # v0-2 broker
    67: ('AllocateProducerIds', 0),  # v0-0 controller
    68: ('ConsumerGroupHeartbeat', 0),  # v0-1 broker
    69: ('ConsumerGroupDescribe', 0),  # v0-1 broker
    70: ('ControllerRegistration', 0),  # v0-0 controller
    71: ('GetTelemetrySubscriptions', 0),  # v0-0 broker
    72: ('PushTelemetry', 0),  # v0-0 broker
    73: ('AssignReplicasToDirs', 0),  # v0-0 controller
    74: ('ListConfigResources', 0),  # v0-1 broker
    75: ('DescribeTopicPartitions', 0),  # v0-0 broker
    76: ('ShareGroupHeartbeat', 0),  # v1-1 broker
    77: ('ShareGroupDescribe', 0),  # v1-1 broker
    78: ('ShareFetch', 0),  # v1-1 broker
    79: ('ShareAcknowledge', 0),  # v1-1 broker
    80: ('AddRaftVoter', 0),  # v0-0 controller,broker
    81: ('RemoveRaftVoter', 0),  # v0-0 controller,broker
    82: ('UpdateRaftVoter', 0),  # v0-0 controller
    83: ('InitializeShareGroupState', 0),  # v0-0 broker
    84: ('ReadShareGroupState', 0),  # v0-0 broker
    85: ('WriteShareGroupState', 0),  # v0-0 broker
    86: ('DeleteShareGroupState', 0),  # v0-0 broker
    87: ('ReadShareGroupStateSummary', 0),  # v0-0 broker
    88: ('StreamsGroupHeartbeat', 0),  # v0-0 broker
    89: ('StreamsGroupDescribe', 0),  # v0-0 broker
    90: ('DescribeShareGroupOffsets', 0),  # v0-0 broker
    91: ('AlterShareGroupOffsets', 0),  # v0-0 broker
    92: ('DeleteShareGroupOffsets', 0),  # v0-0 broker
}
