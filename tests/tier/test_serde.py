"""Metadata record values, keys and the metadata-topic partitioner."""

from __future__ import annotations

import pytest

from protocol.errors import ProtocolError
from tests.support.segments import seg, tp
from tierproxy.tier.model import (
    PartitionDeleteState,
    PassStage,
    RemoteLogStartOffset,
    RemotePartitionDeleteMetadata,
    SegmentState,
    TierPass,
    uuid_str,
)
from tierproxy.tier.rlmm import transition
from tierproxy.tier.serde import decode_value, encode_value, metadata_partition, murmur2, record_key

# computed with org.apache.kafka.common.utils.Utils.murmur2 from kafka-clients 4.1.1
MURMUR2 = {"": 275646681, "a": -1563381124, "ab": 316155434, "abc": 479470107, "abcd": -1323649548,
           "hello-world": 1993811437, "AAAAAAAAAAAAAAAAAAAAAA:topic-7": -203289293}


@pytest.mark.parametrize(("text", "expected"), MURMUR2.items())
def test_murmur2_matches_kafka(text: str, expected: int) -> None:
    assert murmur2(text.encode()) == expected


def test_partitioner_uses_kafkas_topic_id_partition_string() -> None:
    t = tp("orders", 3, bytes(16))
    assert str(t) == "AAAAAAAAAAAAAAAAAAAAAA:orders-3"
    assert metadata_partition(t, 50) == (murmur2(b"AAAAAAAAAAAAAAAAAAAAAA:orders-3") & 0x7FFFFFFF) % 50


def test_round_trips_and_keys() -> None:
    t = tp()
    md = seg(t, 100, 199, {3: 100, 4: 150}, broker_epoch=4)
    assert decode_value(encode_value(md)) == md
    up = transition(md, SegmentState.COPY_SEGMENT_FINISHED)
    assert decode_value(encode_value(up)) == up
    pdm = RemotePartitionDeleteMetadata(t, PartitionDeleteState.DELETE_PARTITION_MARKED, 5, 101, 4, 199)
    assert decode_value(encode_value(pdm)) == pdm
    assert record_key(md) == f"{uuid_str(t.topic_id)}:0:199:4".encode()
    assert record_key(pdm) == f"{uuid_str(t.topic_id)}:0".encode()
    assert encode_value(md)[:2] == b"\x00\x01"  # api key 0, version 1
    purge = RemoteLogStartOffset(t, 150, 6, 101)
    assert decode_value(encode_value(purge)) == purge
    assert record_key(purge) == f"{uuid_str(t.topic_id)}:0:logStart:150".encode()
    assert encode_value(purge)[:2] == b"\x40\x01"  # tierproxy's api key 64, version 1


def test_tier_pass_expiry_and_stage_are_tagged_fields() -> None:
    asked = TierPass("r1", True, 5, expires_ms=65_005)
    taken = TierPass("r1", False, 6, stage=PassStage.TAKEN)
    assert decode_value(encode_value(asked)) == asked and decode_value(encode_value(taken)) == taken
    # a record written before the tags (none on the wire) reads as a finished pass, a request that never expires
    older = decode_value(encode_value(TierPass("r0", False, 7, "tiered 1 segments", 0)))
    assert (older.stage, older.expires_ms) == (PassStage.FINISHED, -1)
    assert len(encode_value(asked)) > len(encode_value(TierPass("r1", True, 5)))  # only a set tag is written


def test_v0_records_decode_with_defaults() -> None:
    md = seg(tp(), 0, 9)
    v0 = encode_value(md, version=0)
    assert v0[:2] == b"\x00\x00"
    assert decode_value(v0).broker_leader_epoch == -1


def test_garbage_values_raise_protocol_error() -> None:
    purge = encode_value(RemoteLogStartOffset(tp(), 1, 2))
    for bad in (b"", b"\x09\x00", b"\x00\x01\x00", encode_value(seg(tp(), 0, 9))[:-3], purge[:-1],
                b"\x40\x00" + purge[2:]):
        with pytest.raises(ProtocolError):
            decode_value(bad)
