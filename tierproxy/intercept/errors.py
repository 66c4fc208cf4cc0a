"""The Kafka error a partition gets when its remote read fails, in one table (first matching row wins).

    ObjectMissing        → OFFSET_OUT_OF_RANGE   the segment was deleted while the read ran
    StorageUnavailable   → KAFKA_STORAGE_ERROR   storage still failing at the fetch's deadline
    PoolFull             → UNKNOWN_SERVER_ERROR  the reader pool is full (answered at once)
    BrokerLogUnavailable → REPLICA_NOT_AVAILABLE a transaction's outcome is in the leader's log, not reachable now
    anything else        → UNKNOWN_SERVER_ERROR
"""

from __future__ import annotations

from protocol.constants import ErrorCode
from tierproxy.remote.pool import PoolFull
from tierproxy.remote.reader import BrokerLogUnavailable
from tierproxy.tier.storage import ObjectMissing, StorageUnavailable

READ_FAILURES: tuple[tuple[type[BaseException], ErrorCode], ...] = (
    (ObjectMissing, ErrorCode.OFFSET_OUT_OF_RANGE),
    (StorageUnavailable, ErrorCode.KAFKA_STORAGE_ERROR),
    (PoolFull, ErrorCode.UNKNOWN_SERVER_ERROR),
    (BrokerLogUnavailable, ErrorCode.REPLICA_NOT_AVAILABLE),
)


def error_for(failure: BaseException) -> ErrorCode:
    """The partition error code for a failed remote read."""
    for kind, code in READ_FAILURES:
        if isinstance(failure, kind):
            return code
    return ErrorCode.UNKNOWN_SERVER_ERROR
