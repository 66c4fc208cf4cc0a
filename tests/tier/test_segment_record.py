"""The segment record's fast reader (`tier.segment_record`) gives what the generic schema reader gives, for every
record: well-formed ones of every shape, and any bytes (both raise, or the fast one steps aside)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol.errors import ProtocolError
from tierproxy.tier.model import RemoteLogSegmentId, RemoteLogSegmentMetadata, SegmentState, TopicIdPartition
from tierproxy.tier.segment_record import read_segment_record
from tierproxy.tier.serde import decode_value, encode_value, shared_tip

int32, int64 = st.integers(-(2**31), 2**31 - 1), st.integers(-(2**63), 2**63 - 1)
segments = st.builds(
    lambda name, tid, part, sid, start, length, ts, broker, epochs, size, state, txn, custom, ble:
    RemoteLogSegmentMetadata(RemoteLogSegmentId(TopicIdPartition(name, tid, part), sid), start, start + length, ts,
                             broker, ts, epochs, size, state, txn, custom, ble),
    st.text(min_size=1, max_size=200), st.binary(min_size=16, max_size=16), st.integers(0, 2**31 - 1),
    st.binary(min_size=16, max_size=16), st.integers(0, 2**62), st.integers(0, 2**20), int64, int32,
    st.dictionaries(int32, st.integers(0, 2**62), min_size=1, max_size=140), int32, st.sampled_from(SegmentState),
    st.booleans(), st.none() | st.binary(max_size=300), int32)


def generic(value: bytes) -> object:
    """The generic reader's event, bypassing the fast path (a memoryview is never read fast)."""
    return decode_value(memoryview(value))


@settings(max_examples=400, deadline=None)
@given(md=segments, version=st.sampled_from([0, 1]))
def test_every_segment_record_reads_the_same_both_ways(md: RemoteLogSegmentMetadata, version: int) -> None:
    value = encode_value(md, version)
    fast = decode_value(value)
    assert fast == generic(value)
    assert list(fast.segment_leader_epochs.items()) == list(generic(value).segment_leader_epochs.items())  # type: ignore[attr-defined]


def test_the_usual_record_is_read_fast() -> None:
    md = RemoteLogSegmentMetadata(RemoteLogSegmentId(TopicIdPartition("orders", b"i" * 16, 3), b"s" * 16), 100,
                                  199, 5, 1, 6, {0: 100, 2: 150}, 4096, SegmentState.COPY_SEGMENT_FINISHED, True,
                                  b"meta", 7)
    fast = read_segment_record(encode_value(md), shared_tip)
    assert fast == md and fast is not None and fast.tp is shared_tip("orders", b"i" * 16, 3)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(md=segments, cut=st.integers(0, 400), flip=st.integers(0, 400), byte=st.integers(0, 255))
def test_damaged_records_read_the_same_or_raise_protocol_error_both_ways(md: RemoteLogSegmentMetadata, cut: int,
                                                                         flip: int, byte: int) -> None:
    value = bytearray(encode_value(md, 1))
    if flip < len(value):
        value[flip] = byte
    damaged = bytes(value[:max(cut, 1)] if cut < len(value) else value + bytes([byte]) * (cut - len(value)))
    try:
        expected: object = generic(damaged)
    except ProtocolError:
        expected = ProtocolError
    try:
        got: object = decode_value(damaged)
    except ProtocolError:
        got = ProtocolError
    assert got == expected


def test_a_repeated_epoch_or_an_unknown_tag_is_left_to_the_generic_reader() -> None:
    md = RemoteLogSegmentMetadata(RemoteLogSegmentId(TopicIdPartition("t", b"i" * 16, 0), b"s" * 16), 0, 9, 5, 1,
                                  6, {0: 0, 1: 5}, 10, SegmentState.COPY_SEGMENT_FINISHED, broker_leader_epoch=-1)
    value = bytearray(encode_value(md))
    epochs_at = 3 + 1 + 16 + 4 + 1 + 16 + 1 + 36 + 1  # name "t", ids, offsets: the first epoch's int32
    value[epochs_at + 13:epochs_at + 17] = value[epochs_at:epochs_at + 4]  # epoch 1 → epoch 0 again
    assert read_segment_record(bytes(value), shared_tip) is None
    assert decode_value(bytes(value)) == generic(bytes(value))
    tagged = bytearray(encode_value(md))
    assert tagged[-1] == 0  # no tagged fields: one of tag 5 (unknown to the schema), 1 byte, follows
    tagged[-1:] = b"\x01\x05\x01\x00"
    assert read_segment_record(bytes(tagged), shared_tip) is None
    assert decode_value(bytes(tagged)) == generic(bytes(tagged))
