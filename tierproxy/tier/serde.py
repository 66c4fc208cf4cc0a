"""Metadata records: the KIP-405 schemas (Kafka 4.1's storage module) plus the compacted-metadata KIP's v1
tagged fields, their keys, and the metadata-topic partitioner.

Record value => api_key:unsigned_varint version:unsigned_varint payload (Kafka protocol, flexible)
    0 RemoteLogSegmentMetadataRecord   (v1 adds tag 1 BrokerLeaderEpoch; tag 0 is Kafka's TxnIndexEmpty)
    1 RemoteLogSegmentMetadataUpdateRecord (v1 adds tag 0 BrokerLeaderEpoch, tag 1 EndOffset)
    2 RemotePartitionDeleteMetadataRecord  (v1 adds tag 0 BrokerLeaderEpoch, tag 1 EndOffset)
   64 RemoteLogStartOffsetRecord (tierproxy's own, v1: a purged partition's log start; Kafka's own RLMM keeps
      the log start in the broker, which tierproxy's brokers know only as their local start)
   65 TierPassRecord (tierproxy's own, v1: a tiering pass asked for through the admin API, and what became of it:
      taken, withdrawn, or the pass that served it; keys "tierproxy:tierPass:requested" / "tierproxy:tierPass:done",
      metadata partition 0; tag 0 ExpiresMs: no job takes the request from then, tag 1 Stage)
   66 TopicMountRecord (tierproxy's own, v1: a topic id of a lost cluster handed by a restore to the cluster that
      owns the tier now, with the restored topic's id there; key "tierproxy:mount:originId", metadata partition 0)
   67 TransactionOutcomeRecord (tierproxy's own, v1: the outcome of a transaction open at a tiered segment's end,
      `tier.transactions`; key "topicId:partition:txn:producerId:firstOffset", the partition's metadata partition)
Record key (compacted topic) => "topicId:partition:endOffset:brokerLeaderEpoch" for segment records,
    except a segment that has not finished its copy: "topicId:partition:segment:segmentId" (see below),
    "topicId:partition" for partition-deletion records, "topicId:partition:logStart:offset" for log start
    records (topic ids in Kafka's base64 form). A log start's key names its offset, so compaction can never leave
    a lower one standing after a higher one: two replicas recording purges at once each write their own key, the
    cache keeps the highest, and the writer of a higher one tombstones the lower keys it knows.
A broker uploads closed segments, so the compacted-metadata KIP keys even COPY_SEGMENT_STARTED by its (known) end
offset. tierproxy plans ranges whose real end is known only once copied: a batch crossing a range boundary makes
one copy end where the next range was planned to end, and that range, empty, would then be deleted under the
very key of the live segment (compaction keeping the deletion). So a segment is keyed by its id from
COPY_SEGMENT_STARTED until COPY_SEGMENT_FINISHED (that key is then tombstoned); a copy deleted before it finished
stays under its id key to the end. Segments started under the end-offset key (older tierproxy) keep it.
A replacement (`tier.replacement`: a tier compaction's segment) stays under its id key for its whole life: its end
offset is the end of a segment it replaces, live under that KIP key until it is deleted.
"""

from __future__ import annotations

from collections.abc import Mapping

from protocol.errors import ProtocolError
from protocol.primitives import Reader, Writer, buffers
from protocol.schema import F, Message
from tierproxy.tier.model import (
    PartitionDeleteState,
    PassStage,
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemoteLogStartOffset,
    RemotePartitionDeleteMetadata,
    SegmentState,
    TierPass,
    TopicIdPartition,
    TopicMount,
    TransactionOutcome,
    TxnOutcome,
    uuid_str,
)
from tierproxy.tier.segment_record import read_segment_record

Event = (RemoteLogSegmentMetadata | RemoteLogSegmentMetadataUpdate | RemotePartitionDeleteMetadata
         | RemoteLogStartOffset | TierPass | TopicMount | TransactionOutcome)
VERSION = 1

_TIP = [F("name", "string", "0+"), F("id", "uuid", "0+"), F("partition", "int32", "0+")]
_SEGMENT_ID = [F("topic_id_partition", "{}", "0+", fields=_TIP), F("id", "uuid", "0+")]
_EPOCHS = [F("leader_epoch", "int32", "0+"), F("offset", "int64", "0+")]

SEGMENT_RECORD = Message("RemoteLogSegmentMetadataRecord", api_key=0, versions="0-1", flexible="0+", fields=[
    F("remote_log_segment_id", "{}", "0+", fields=_SEGMENT_ID),
    F("start_offset", "int64", "0+"),
    F("end_offset", "int64", "0+"),
    F("broker_id", "int32", "0+"),
    F("max_timestamp_ms", "int64", "0+"),
    F("event_timestamp_ms", "int64", "0+"),
    F("segment_leader_epochs", "[]", "0+", fields=_EPOCHS),
    F("segment_size_in_bytes", "int32", "0+"),
    F("custom_metadata", "bytes", "0+", nullable="0+", default=None),
    F("remote_log_segment_state", "int8", "0+"),
    F("txn_index_empty", "bool", "0+", tag=0, default=False),
    F("broker_leader_epoch", "int32", "1+", tag=1, default=-1),
])

UPDATE_RECORD = Message("RemoteLogSegmentMetadataUpdateRecord", api_key=1, versions="0-1", flexible="0+", fields=[
    F("remote_log_segment_id", "{}", "0+", fields=_SEGMENT_ID),
    F("broker_id", "int32", "0+"),
    F("event_timestamp_ms", "int64", "0+"),
    F("custom_metadata", "bytes", "0+", nullable="0+", default=None),
    F("remote_log_segment_state", "int8", "0+"),
    F("broker_leader_epoch", "int32", "1+", tag=0, default=-1),
    F("end_offset", "int64", "1+", tag=1, default=-1),
])

PARTITION_DELETE_RECORD = Message("RemotePartitionDeleteMetadataRecord", api_key=2, versions="0-1", flexible="0+",
                                  fields=[
    F("topic_id_partition", "{}", "0+", fields=_TIP),
    F("broker_id", "int32", "0+"),
    F("event_timestamp_ms", "int64", "0+"),
    F("remote_partition_delete_state", "int8", "0+"),
    F("broker_leader_epoch", "int32", "1+", tag=0, default=-1),
    F("end_offset", "int64", "1+", tag=1, default=-1),
])

LOG_START_RECORD = Message("RemoteLogStartOffsetRecord", api_key=64, versions="1", flexible="1+", fields=[
    F("topic_id_partition", "{}", "1+", fields=_TIP),
    F("broker_id", "int32", "1+"),
    F("event_timestamp_ms", "int64", "1+"),
    F("log_start_offset", "int64", "1+"),
])

TIER_PASS_RECORD = Message("TierPassRecord", api_key=65, versions="1", flexible="1+", fields=[
    F("request_id", "string", "1+"),
    F("requested", "bool", "1+"),
    F("event_timestamp_ms", "int64", "1+"),
    F("summary", "string", "1+", nullable="1+", default=None),
    F("returncode", "int32", "1+"),
    F("expires_ms", "int64", "1+", tag=0, default=-1),
    F("stage", "int8", "1+", tag=1, default=0),
])

MOUNT_RECORD = Message("TopicMountRecord", api_key=66, versions="1", flexible="1+", fields=[
    F("topic", "string", "1+"),
    F("origin_id", "uuid", "1+"),
    F("alias_id", "uuid", "1+"),
    F("origin_cluster", "string", "1+"),
    F("owner_cluster", "string", "1+"),
    F("event_timestamp_ms", "int64", "1+"),
])

TXN_OUTCOME_RECORD = Message("TransactionOutcomeRecord", api_key=67, versions="1", flexible="1+", fields=[
    F("topic_id_partition", "{}", "1+", fields=_TIP),
    F("producer_id", "int64", "1+"),
    F("first_offset", "int64", "1+"),
    F("outcome", "int8", "1+"),
    F("learnt", "string", "1+"),
    F("event_timestamp_ms", "int64", "1+"),
])

_BY_KEY = {m.api_key: m for m in (SEGMENT_RECORD, UPDATE_RECORD, PARTITION_DELETE_RECORD, LOG_START_RECORD,
                                  TIER_PASS_RECORD, MOUNT_RECORD, TXN_OUTCOME_RECORD)}


def _tip(tp: TopicIdPartition) -> dict[str, object]:
    return {"name": tp.topic, "id": tp.topic_id, "partition": tp.partition}


def _seg_id(s: RemoteLogSegmentId) -> dict[str, object]:
    return {"topic_id_partition": _tip(s.tp), "id": s.id}


_TIPS: dict[tuple[str, bytes, int], TopicIdPartition] = {}  # one object per partition, not one per record
_TIPS_MAX = 200_000  # partitions remembered at most (emptied, then filled again, past that)


def _from_tip(d: dict[str, object]) -> TopicIdPartition:
    return shared_tip(str(d["name"]), bytes(d["id"]), int(d["partition"]))  # type: ignore[call-overload]


def shared_tip(name: str, topic_id: bytes, partition: int) -> TopicIdPartition:
    """The partition a record names, shared by every record that names it: a million segments of a thousand
    partitions hold a thousand of these, not a million (their names and ids with them)."""
    key = (name, topic_id, partition)
    found = _TIPS.get(key)
    if found is None:
        if len(_TIPS) >= _TIPS_MAX:
            _TIPS.clear()
        found = _TIPS[key] = TopicIdPartition(*key)
    return found


def _from_seg_id(d: dict[str, object]) -> RemoteLogSegmentId:
    return RemoteLogSegmentId(_from_tip(d["topic_id_partition"]), bytes(d["id"]))  # type: ignore[arg-type, call-overload]


def _epochs(d: Mapping[int, int]) -> list[dict[str, int]]:
    return [{"leader_epoch": e, "offset": o} for e, o in sorted(d.items(), key=lambda kv: kv[1])]


def encode_value(event: Event, version: int = VERSION) -> bytes:
    w = Writer()
    if isinstance(event, RemoteLogSegmentMetadata):
        msg, data = SEGMENT_RECORD, {
            "remote_log_segment_id": _seg_id(event.segment_id), "start_offset": event.start_offset,
            "end_offset": event.end_offset, "broker_id": event.broker_id, "max_timestamp_ms": event.max_timestamp_ms,
            "event_timestamp_ms": event.event_timestamp_ms,
            "segment_leader_epochs": _epochs(event.segment_leader_epochs),
            "segment_size_in_bytes": event.segment_size_in_bytes, "custom_metadata": event.custom_metadata,
            "remote_log_segment_state": int(event.state), "txn_index_empty": event.txn_index_empty,
            "broker_leader_epoch": event.broker_leader_epoch}
    elif isinstance(event, RemoteLogSegmentMetadataUpdate):
        msg, data = UPDATE_RECORD, {
            "remote_log_segment_id": _seg_id(event.segment_id), "broker_id": event.broker_id,
            "event_timestamp_ms": event.event_timestamp_ms, "custom_metadata": event.custom_metadata,
            "remote_log_segment_state": int(event.state), "broker_leader_epoch": event.broker_leader_epoch,
            "end_offset": event.end_offset}
    elif isinstance(event, TierPass):
        msg, data = TIER_PASS_RECORD, {
            "request_id": event.request_id, "requested": event.requested,
            "event_timestamp_ms": event.event_timestamp_ms, "summary": event.summary, "returncode": event.returncode,
            "expires_ms": event.expires_ms, "stage": int(event.stage)}
    elif isinstance(event, TopicMount):
        msg, data = MOUNT_RECORD, {
            "topic": event.topic, "origin_id": event.origin_id, "alias_id": event.alias_id,
            "origin_cluster": event.origin_cluster, "owner_cluster": event.owner_cluster,
            "event_timestamp_ms": event.event_timestamp_ms}
    elif isinstance(event, TransactionOutcome):
        msg, data = TXN_OUTCOME_RECORD, {
            "topic_id_partition": _tip(event.tp), "producer_id": event.producer_id,
            "first_offset": event.first_offset, "outcome": int(event.outcome), "learnt": event.learnt,
            "event_timestamp_ms": event.event_timestamp_ms}
    elif isinstance(event, RemoteLogStartOffset):
        msg, data = LOG_START_RECORD, {
            "topic_id_partition": _tip(event.tp), "broker_id": event.broker_id,
            "event_timestamp_ms": event.event_timestamp_ms, "log_start_offset": event.log_start_offset}
    else:
        msg, data = PARTITION_DELETE_RECORD, {
            "topic_id_partition": _tip(event.tp), "broker_id": event.broker_id,
            "event_timestamp_ms": event.event_timestamp_ms, "remote_partition_delete_state": int(event.state),
            "broker_leader_epoch": event.broker_leader_epoch, "end_offset": event.end_offset}
    w.unsigned_varint(msg.api_key)
    w.unsigned_varint(version)
    msg.encode_into(w, data, version)
    return b"".join(buffers(w.finish()))


def decode_value(value: bytes | memoryview) -> Event:
    """Decode a metadata record value; malformed input raises `ProtocolError`."""
    if type(value) is bytes and value[:1] == b"\0":  # a segment's record: the usual shape read fast
        try:
            fast = read_segment_record(value, shared_tip)
        except ValueError as exc:
            raise ProtocolError(f"bad remote log metadata record: {exc}") from None
        if fast is not None:
            return fast
    r = Reader(memoryview(value))
    api_key, version = r.unsigned_varint(), r.unsigned_varint()
    msg = _BY_KEY.get(api_key)
    if msg is None:
        raise ProtocolError(f"unknown remote log metadata record type {api_key}")
    d = msg.decode(r.buf, version, r.pos)
    try:
        if api_key == 0:
            return RemoteLogSegmentMetadata(
                _from_seg_id(d["remote_log_segment_id"]), d["start_offset"], d["end_offset"], d["max_timestamp_ms"],
                d["broker_id"], d["event_timestamp_ms"],
                {e["leader_epoch"]: e["offset"] for e in d["segment_leader_epochs"]}, d["segment_size_in_bytes"],
                SegmentState(d["remote_log_segment_state"]), d["txn_index_empty"],
                None if d["custom_metadata"] is None else bytes(d["custom_metadata"]), d["broker_leader_epoch"])
        if api_key == 1:
            return RemoteLogSegmentMetadataUpdate(
                _from_seg_id(d["remote_log_segment_id"]), d["event_timestamp_ms"],
                SegmentState(d["remote_log_segment_state"]), d["broker_id"],
                None if d["custom_metadata"] is None else bytes(d["custom_metadata"]), d["broker_leader_epoch"],
                d["end_offset"])
        if api_key == TIER_PASS_RECORD.api_key:
            return TierPass(d["request_id"], d["requested"], d["event_timestamp_ms"], d["summary"], d["returncode"],
                            d["expires_ms"], PassStage(d["stage"]))
        if api_key == MOUNT_RECORD.api_key:
            return TopicMount(d["topic"], bytes(d["origin_id"]), bytes(d["alias_id"]), d["origin_cluster"],
                              d["owner_cluster"], d["event_timestamp_ms"])
        if api_key == TXN_OUTCOME_RECORD.api_key:
            return TransactionOutcome(_from_tip(d["topic_id_partition"]), d["producer_id"], d["first_offset"],
                                      TxnOutcome(d["outcome"]), d["learnt"], d["event_timestamp_ms"])
        if api_key == LOG_START_RECORD.api_key:
            return RemoteLogStartOffset(_from_tip(d["topic_id_partition"]), d["log_start_offset"],
                                        d["event_timestamp_ms"], d["broker_id"])
        return RemotePartitionDeleteMetadata(_from_tip(d["topic_id_partition"]),
                                             PartitionDeleteState(d["remote_partition_delete_state"]),
                                             d["event_timestamp_ms"], d["broker_id"], d["broker_leader_epoch"],
                                             d["end_offset"])
    except ValueError as exc:
        raise ProtocolError(f"bad remote log metadata record: {exc}") from None


def record_key(event: Event, end_offset: int | None = None) -> bytes:
    """The compacted topic's key: topicId:partition:endOffset:brokerLeaderEpoch (partitions: topicId:partition)."""
    if isinstance(event, RemotePartitionDeleteMetadata):
        return f"{uuid_str(event.tp.topic_id)}:{event.tp.partition}".encode()
    if isinstance(event, TierPass):
        return b"tierproxy:tierPass:requested" if event.requested else b"tierproxy:tierPass:done"
    if isinstance(event, TopicMount):
        return f"tierproxy:mount:{uuid_str(event.origin_id)}".encode()
    if isinstance(event, RemoteLogStartOffset):
        return f"{uuid_str(event.tp.topic_id)}:{event.tp.partition}:logStart:{event.log_start_offset}".encode()
    if isinstance(event, TransactionOutcome):  # one per transaction: compaction keeps its latest outcome
        return (f"{uuid_str(event.tp.topic_id)}:{event.tp.partition}:txn:{event.producer_id}:"
                f"{event.first_offset}").encode()
    if isinstance(event, RemoteLogSegmentMetadata):
        tp, end = event.tp, event.end_offset
    else:
        tp, end = event.segment_id.tp, event.end_offset if end_offset is None else end_offset
    return f"{uuid_str(tp.topic_id)}:{tp.partition}:{end}:{event.broker_leader_epoch}".encode()


def segment_id_key(segment_id: RemoteLogSegmentId) -> bytes:
    """The key of a segment that has not finished its copy: topicId:partition:segment:segmentId."""
    tp = segment_id.tp
    return f"{uuid_str(tp.topic_id)}:{tp.partition}:segment:{uuid_str(segment_id.id)}".encode()


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (org.apache.kafka.common.utils.Utils.murmur2), as a signed 32-bit int."""
    length = len(data)
    seed, m, r = 0x9747B28C, 0x5BD1E995, 24
    h = (seed ^ length) & 0xFFFFFFFF
    for i in range(0, length - length % 4, 4):
        k = data[i] | data[i + 1] << 8 | data[i + 2] << 16 | data[i + 3] << 24
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = (h * m) & 0xFFFFFFFF
        h ^= k
    rest = length % 4
    tail = length - rest
    if rest == 3:
        h ^= data[tail + 2] << 16
    if rest >= 2:
        h ^= data[tail + 1] << 8
    if rest >= 1:
        h ^= data[tail]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def metadata_partition(tp: TopicIdPartition, partitions: int) -> int:
    """Kafka's RemoteLogMetadataTopicPartitioner: toPositive(murmur2(tp.toString())) % N."""
    return (murmur2(str(tp).encode()) & 0x7FFFFFFF) % partitions
