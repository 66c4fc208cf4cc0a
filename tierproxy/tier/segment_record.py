"""A fast reader for the commonest metadata record: a segment's (`RemoteLogSegmentMetadataRecord`, api key 0).

A view of a large tier reads a million of them at start; the generic schema reader (`protocol.schema`) spends
~25 µs on each, walking field plans and building dicts. This reads the record's usual shape with a few
precompiled structs straight into the model; anything else — a length or count past one varint byte, an unknown
tagged field, a repeated leader epoch, trailing bytes, bad UTF-8 — returns None, and the caller reads it the
generic way, which decides what is malformed. Both readers give the same event for every record (a Hypothesis test
holds them to it).

Record value (flexible), as `tier.serde.SEGMENT_RECORD` declares it:
    api_key:uvarint(0) version:uvarint(0|1)
    segment id     => topic name:compact_string topic id:uuid partition:int32 _tagged id:uuid _tagged
    start_offset:int64 end_offset:int64 broker_id:int32 max_timestamp_ms:int64 event_timestamp_ms:int64
    leader epochs  => compact_array of (epoch:int32 start offset:int64 _tagged)
    segment_size_in_bytes:int32 custom_metadata:compact_nullable_bytes state:int8
    _tagged        => tag 0 txn_index_empty:bool, tag 1 broker_leader_epoch:int32 (v1)
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from tierproxy.tier.model import (
    LeaderEpochs,
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    SegmentState,
    TopicIdPartition,
)

_PARTITION = struct.Struct(">i")  # the topic-id partition's partition
_OFFSETS = struct.Struct(">qqiqq")  # start offset, end offset, broker id, max timestamp, event timestamp
_EPOCH = struct.Struct(">iqB")  # leader epoch, its first offset, the entry's tagged-field count (0)
_SIZE = struct.Struct(">i")  # segment size in bytes
_BLE = struct.Struct(">i")  # tag 1: broker leader epoch
_STATES = {s.value: s for s in SegmentState}


def read_segment_record(value: bytes, tip: Callable[[str, bytes, int], TopicIdPartition]
                        ) -> RemoteLogSegmentMetadata | None:
    """The segment a record value of the usual shape holds, or None (read it the generic way). `tip` gives the
    shared partition object for (name, id, partition), as the generic reader's does. Raises ValueError for a
    record whose values the model refuses (as the generic path does)."""
    n = len(value)
    if n < 3 or value[0] != 0 or value[1] > 1:
        return None
    version = value[1]
    name_len = value[2] - 1
    if name_len < 0 or name_len > 126:
        return None
    p = 3 + name_len
    if p + 16 + 4 + 1 + 16 + 1 + 36 + 1 > n:
        return None
    try:
        name = value[3:p].decode()
    except UnicodeDecodeError:
        return None
    topic_id = value[p:p + 16]
    partition = _PARTITION.unpack_from(value, p + 16)[0]
    if value[p + 20] != 0:  # the partition's tagged fields
        return None
    seg_id = value[p + 21:p + 37]
    if value[p + 37] != 0:  # the segment id's tagged fields
        return None
    start, end, broker, max_ts, event_ts = _OFFSETS.unpack_from(value, p + 38)
    p += 74
    count = value[p] - 1
    if count < 0 or count > 126 or p + 1 + 13 * count + 4 + 1 + 1 + 1 > n:
        return None
    p += 1
    flat: list[int] = []
    for _ in range(count):
        epoch, offset, tags = _EPOCH.unpack_from(value, p)
        if tags != 0:
            return None
        flat += (epoch, offset)
        p += 13
    if len(set(flat[0::2])) != count:  # a repeated epoch: the generic reader's dict decides which one stands
        return None
    size = _SIZE.unpack_from(value, p)[0]
    p += 4
    meta_len = value[p] - 1
    if meta_len > 126 or p + 1 + max(meta_len, 0) + 2 > n:
        return None
    p += 1
    custom = None
    if meta_len >= 0:
        custom = value[p:p + meta_len]
        p += meta_len
    state = _STATES.get(value[p])
    tags = value[p + 1]
    p += 2
    txn_empty, ble = False, -1
    if state is None or tags > 2:
        return None
    last = -1
    for _ in range(tags):
        if p + 2 > n:
            return None
        tag, size_of = value[p], value[p + 1]
        p += 2
        if tag <= last or p + size_of > n:
            return None
        last = tag
        if tag == 0 and size_of == 1 and value[p] in (0, 1):
            txn_empty = value[p] == 1
        elif tag == 1 and version >= 1 and size_of == 4:
            ble = _BLE.unpack_from(value, p)[0]
        else:
            return None
        p += size_of
    if p != n:
        return None
    return RemoteLogSegmentMetadata(RemoteLogSegmentId(tip(name, topic_id, partition), seg_id), start, end, max_ts,
                                    broker, event_ts, LeaderEpochs.of_flat(tuple(flat)), size, state, txn_empty,
                                    custom, ble)
