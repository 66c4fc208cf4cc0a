"""Every Kafka error the intercepts answer of their own (Fetch, ListOffsets, DeleteRecords), in one table.

A remote read that failed (first matching row wins):

    ObjectMissing        → OFFSET_OUT_OF_RANGE   the segment was deleted while the read ran
    StorageUnavailable   → KAFKA_STORAGE_ERROR   storage still failing at the fetch's deadline
    BrokerLogUnavailable → REPLICA_NOT_AVAILABLE a transaction's outcome is in the leader's log, not reachable now
    anything else        → UNKNOWN_SERVER_ERROR

and the situations without a failed read:

    LOADING         REPLICA_NOT_AVAILABLE  the segment metadata is not loaded: never a reset past history
    OFFSETS_UNKNOWN REPLICA_NOT_AVAILABLE  the leader's HW/LSO/log start could not be asked: never offsets of ours
    SEGMENT_GONE    OFFSET_OUT_OF_RANGE    no tiered segment holds the offset any more: the broker's answer stands
    LOST_OBJECT     UNKNOWN_SERVER_ERROR   an object missing while the metadata still lists its segment: the
                                           client retries the same offset (as Kafka answers remote storage failures)
    LOOKUP_FAILED   KAFKA_STORAGE_ERROR    a ListOffsets timestamp lookup in the tier failed: never the broker's
                                           later, local answer, which would skip the tiered records
    NOT_RECORDED    KAFKA_STORAGE_ERROR    a purge could not be written to the metadata (or it is still loading):
                                           nothing purged; DeleteRecords is idempotent, the retry records it

A full reader pool is not an error: the partition is answered empty at the purgatory's deadline.
"""

from __future__ import annotations

from protocol.constants import ErrorCode
from tierproxy.remote.reader import BrokerLogUnavailable
from tierproxy.tier.storage import ObjectMissing, StorageUnavailable

READ_FAILURES: tuple[tuple[type[BaseException], ErrorCode], ...] = (
    (ObjectMissing, ErrorCode.OFFSET_OUT_OF_RANGE),
    (StorageUnavailable, ErrorCode.KAFKA_STORAGE_ERROR),
    (BrokerLogUnavailable, ErrorCode.REPLICA_NOT_AVAILABLE),
)
LOADING = ErrorCode.REPLICA_NOT_AVAILABLE
OFFSETS_UNKNOWN = ErrorCode.REPLICA_NOT_AVAILABLE
SEGMENT_GONE = ErrorCode.OFFSET_OUT_OF_RANGE
LOST_OBJECT = ErrorCode.UNKNOWN_SERVER_ERROR
LOOKUP_FAILED = ErrorCode.KAFKA_STORAGE_ERROR
NOT_RECORDED = ErrorCode.KAFKA_STORAGE_ERROR


def error_for(failure: BaseException) -> ErrorCode:
    """The partition error code for a failed remote read."""
    for kind, code in READ_FAILURES:
        if isinstance(failure, kind):
            return code
    return ErrorCode.UNKNOWN_SERVER_ERROR
