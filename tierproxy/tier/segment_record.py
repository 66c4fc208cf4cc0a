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

# the topic id, partition, its tagged fields (0), the segment id, its tagged fields (0), start offset, end offset,
# broker id, max timestamp, event timestamp, and the leader epochs' count + 1
_HEAD = struct.Struct(">16siB16sBqqiqqB")
_EPOCH = struct.Struct(">iqB")  # leader epoch, its first offset, the entry's tagged-field count (0)
_ONE_EPOCH = struct.Struct(">iqBiB")  # the one epoch entry, then segment size and custom metadata's length + 1
_SIZE_META = struct.Struct(">iB")  # segment size in bytes, custom metadata's length + 1 (0: null)
_SIZE = struct.Struct(">i")
_BLE = struct.Struct(">i")  # tag 1: broker leader epoch
_TIPS: dict[bytes, TopicIdPartition] = {}  # the partition as a record names it → its shared object
_TIPS_MAX = 200_000
_STATES = {s.value: s for s in SegmentState}


def read_segment_record(value: bytes, tip: Callable[[str, bytes, int], TopicIdPartition]
                        ) -> RemoteLogSegmentMetadata | None:
    """The segment a record value of the usual shape holds, or None (read it the generic way). `tip` gives the
    shared partition object for (name, id, partition), as the generic reader's does. Raises ValueError for a
    record whose values the model refuses (as the generic path does)."""
    n = len(value)
    if n < 80 or value[0] != 0 or value[1] > 1 or not 1 <= value[2] < 128:
        return None
    version = value[1]
    p = 2 + value[2]  # past the topic name
    if p + 75 + 7 > n:
        return None
    (topic_id, partition, tip_tags, seg_id, id_tags, start, end, broker, max_ts, event_ts,
     count) = _HEAD.unpack_from(value, p)
    if tip_tags or id_tags:
        return None
    where = value[2:p + 20]  # the partition as named: its name's length, name, id and number
    shared = _TIPS.get(where) or _new_tip(where, value[3:p], topic_id, partition, tip)
    if shared is None:
        return None
    p += 75
    count -= 1
    if count == 1:  # one leader epoch: the usual segment
        if p + 13 + 4 + 1 + 2 > n:
            return None
        epoch, offset, epoch_tags, size, meta_len = _ONE_EPOCH.unpack_from(value, p)
        if epoch_tags:
            return None
        flat: tuple[int, ...] = (epoch, offset)
        p += 18
    else:
        if count < 0 or count > 126 or p + 13 * count + 4 + 1 + 2 > n:
            return None
        pairs: list[int] = []
        for _ in range(count):
            epoch, offset, epoch_tags = _EPOCH.unpack_from(value, p)
            if epoch_tags:
                return None
            pairs += (epoch, offset)
            p += 13
        if len(set(pairs[0::2])) != count:  # a repeated epoch: the generic reader's dict decides which one stands
            return None
        flat = tuple(pairs)
        size, meta_len = _SIZE_META.unpack_from(value, p)
        p += 5
    meta_len -= 1
    custom = None
    if meta_len >= 0:
        if meta_len > 126 or p + meta_len + 2 > n:
            return None
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
    return RemoteLogSegmentMetadata.of_read(RemoteLogSegmentId(shared, seg_id), start, end, max_ts, broker, event_ts,
                                            LeaderEpochs.of_flat(flat), size, state, txn_empty, custom, ble)


def partition_named(value: bytes, tip: Callable[[str, bytes, int], TopicIdPartition]) -> TopicIdPartition | None:
    """The partition a segment record of the usual shape names (the shared object `tip` gives, as the fast reader's),
    without reading the rest: what groups a view's records by partition before they are read (`tier.cache`). None:
    not a segment record of that shape (read it whole). The generic reader reads the same bytes as this partition."""
    n = len(value)
    if n < 80 or value[0] != 0 or value[1] > 1 or not 1 <= value[2] < 128 or value[2] + 22 > n:
        return None
    where = value[2:value[2] + 22]  # the name's length, the name, the topic id, the partition
    p = 2 + value[2]
    return _TIPS.get(where) or _new_tip(where, value[3:p], value[p:p + 16],
                                        int.from_bytes(value[p + 16:p + 20], signed=True), tip)


def _new_tip(where: bytes, name: bytes, topic_id: bytes, partition: int,
             tip: Callable[[str, bytes, int], TopicIdPartition]) -> TopicIdPartition | None:
    """The shared partition object of a partition named `where` first seen now (None: its name is no UTF-8)."""
    try:
        decoded = name.decode()
    except UnicodeDecodeError:
        return None
    if len(_TIPS) >= _TIPS_MAX:
        _TIPS.clear()
    shared = _TIPS[where] = tip(decoded, topic_id, partition)
    return shared


_SPAN = struct.Struct(">qq")  # start offset, end offset
_EVENT_TS = struct.Struct(">q")


def peek_segment_record(value: bytes) -> tuple[int, int, int, int] | None:
    """(start offset, end offset, event timestamp, size in bytes) of a record value of the usual shape that was
    read whole before (the view keeps only such records as they came), without making the segment: what ordering
    a partition's served segments and summing them need. None: not the usual shape (make the segment instead)."""
    if len(value) < 80 or value[0] != 0 or not 1 <= value[2] < 128:
        return None
    p = 2 + value[2]
    if value[p + 20] != 0 or value[p + 37] != 0:
        return None
    start, end = _SPAN.unpack_from(value, p + 38)
    event_ts = _EVENT_TS.unpack_from(value, p + 66)[0]
    count = value[p + 74] - 1
    at = p + 75 + 13 * count
    if not 0 <= count < 127 or at + 4 > len(value) or any(value[at - 1 - 13 * i] for i in range(count)):
        return None  # (the last: an epoch entry's tagged fields, which would move the size)
    return start, end, event_ts, _SIZE.unpack_from(value, at)[0]
