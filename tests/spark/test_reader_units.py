"""The DataFrame reader's pure parts, without Spark: option parsing, record decoding into columns (checked against
`protocol.records`), the read_committed filter and the byte range an offset range needs."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import compression
from protocol.errors import ProtocolError
from protocol.records import ABORT, COMMIT, Header, Record, build_batch, build_control_batch, iter_batches
from tierproxy.jobs.spark.columns import RecordColumns
from tierproxy.jobs.spark.options import OptionError, parse_options
from tierproxy.jobs.spark.rows import arrow_batches, visible_batches
from tierproxy.jobs.spark.source import byte_range
from tierproxy.tier.indexes import build_segment

# the Arrow schema Spark asks a Python data source for, with headers
SCHEMA = pa.schema([("key", pa.binary()), ("value", pa.binary()), ("topic", pa.string()), ("partition", pa.int32()),
                    ("offset", pa.int64()), ("timestamp", pa.timestamp("us", "UTC")), ("timestampType", pa.int32()),
                    ("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())])))])
BASE = {"kafka.bootstrap.servers": "b:9092", "storage": "file:///t", "subscribe": "orders"}


def test_options_as_sparks_kafka_source_names_them() -> None:
    o = parse_options({**BASE, "startingOffsets": '{"orders": {"0": 23, "1": -2}}', "endingOffsets": "latest",
                       "kafka.isolation.level": "read_committed", "includeHeaders": "TRUE", "failOnDataLoss": "false",
                       "includeLive": "true", "startingTimestamp": "1000"})
    assert o.subscribe == ("orders",) and o.starting == {("orders", 0): 23, ("orders", 1): -2}
    assert o.ending == "latest" and o.read_committed and o.include_headers and not o.fail_on_data_loss
    assert o.include_live and o.starting_ts == 1000
    assert parse_options({**BASE, "subscribe": "", "assign": '{"a": [0, 2]}'}).assign == {"a": [0, 2]}
    assert parse_options({**BASE, "SubScribe": "x,y"}).subscribe == ("x", "y")  # keys are case-insensitive
    d = parse_options(BASE)
    assert d.starting == "earliest" and not d.read_committed and not d.include_headers and d.fail_on_data_loss


@pytest.mark.parametrize("extra, named", [
    ({"kafka.security.protocol": "SSL"}, "kafka.security.protocol"),
    ({"startingOffsets": "somewhere"}, "startingOffsets"),
    ({"endingOffsets": "earliest"}, "endingOffsets"),
    ({"kafka.isolation.level": "read_dirty"}, "kafka.isolation.level"),
    ({"includeHeaders": "yes"}, "includeHeaders"),
    ({"assign": '{"a": [0]}'}, "exactly one of"),
    ({"startingTimestamp": "1", "startingOffsetsByTimestamp": '{"a": {"0": 1}}'}, "exclude each other"),
    ({"maxBytesPerPartition": "0"}, "maxBytesPerPartition"),
    ({"minPartitions": "many"}, "minPartitions"),
    ({"startingOffsets": '{"orders": {"0": -7}}'}, "startingOffsets"),
])
def test_bad_options_name_the_option(extra: dict[str, str], named: str) -> None:
    with pytest.raises(OptionError, match=named):
        parse_options({**BASE, **extra})


def test_missing_storage_or_bootstrap_is_named() -> None:
    with pytest.raises(OptionError, match="'storage'"):
        parse_options({k: v for k, v in BASE.items() if k != "storage"})
    with pytest.raises(OptionError, match=r"kafka\.bootstrap\.servers"):
        parse_options({k: v for k, v in BASE.items() if k != "kafka.bootstrap.servers"})


@pytest.mark.parametrize("codec", [compression.NONE, compression.GZIP, compression.SNAPPY, compression.LZ4,
                                   compression.ZSTD])
@pytest.mark.parametrize("log_append", [False, True])
def test_columns_equal_the_codecs_records(codec: int, log_append: bool) -> None:
    # one-, two- and three-byte varints in every field: offset deltas to 299, values to 21 KB, timestamps apart
    recs = [Record(100 + i, 1_700_000_000_000 + i * 997, None if i % 3 == 0 else f"k{i}".encode() * (i % 90),
                   None if i % 5 == 0 else b"v" * (i * 70), [Header("h", b"x"), Header("n", None)] if i % 2 else [])
            for i in range(300)]
    batch = next(iter_batches(build_batch(recs, base_offset=100, codec=codec, log_append_time=log_append)))
    cols = RecordColumns(want_headers=True)
    cols.decode(batch, 110, 390)
    cols.decode(batch, 0, 0)  # nothing in range: nothing appended
    rows = cols.to_arrow("t", 9, SCHEMA).to_pylist()
    want = [r for r in batch.records() if 110 <= r.offset < 390]
    assert [r["offset"] for r in rows] == [r.offset for r in want] == list(range(110, 390))
    assert [r["key"] for r in rows] == [r.key for r in want] and [r["value"] for r in rows] == [r.value for r in want]
    stamp = batch.max_timestamp if log_append else None
    assert [round(r["timestamp"].timestamp() * 1000) for r in rows] == [stamp or r.timestamp for r in want]
    assert [r["timestampType"] for r in rows] == [1 if log_append else 0] * 280
    assert {(r["topic"], r["partition"]) for r in rows} == {("t", 9)}
    assert [r["headers"] for r in rows] == [[{"key": h.key, "value": h.value} for h in r.headers] or None
                                            for r in want]


def test_columns_grow_past_their_first_size_and_keep_what_they_held() -> None:
    big = [Record(i, i, bytes([i % 256]) * 3000, bytes([i % 7]) * 700_000 if i == 3 else b"v%d" % i,
                  [Header(f"h{j}", b"x" * 5000) for j in range(3)]) for i in range(2000)]
    raw = build_batch(big[:1000]) + build_batch(big[1000:], base_offset=1000)
    cols = RecordColumns(want_headers=True)
    for b in iter_batches(raw):
        cols.decode(b, 0, 2000)
    rows = cols.to_arrow("t", 0, SCHEMA).to_pylist()
    assert [(r["key"], r["value"]) for r in rows] == [(r.key, r.value) for r in big]
    assert all(len(r["headers"]) == 3 and r["headers"][2] == {"key": "h2", "value": b"x" * 5000} for r in rows)
    nxt = RecordColumns(want_headers=True, like=cols)  # sized like the last: decoding the same needs no growth
    sizes = nxt.value_data.size, nxt.offsets.size
    for b in iter_batches(raw):
        nxt.decode(b, 0, 2000)
    assert (nxt.value_data.size, nxt.offsets.size) == sizes and len(nxt) == 2000


def test_read_committed_drops_aborted_batches_and_every_control_batch() -> None:
    def data(offset: int, pid: int, txn: bool) -> bytes:
        return build_batch([Record(offset, 0, None, f"{pid}@{offset}".encode())], base_offset=offset,
                           producer_id=pid, producer_epoch=0, transactional=txn)

    raw = (data(0, 7, True) + data(1, 8, True) + data(2, -1, False) + build_control_batch(ABORT, offset=3,
           producer_id=7, producer_epoch=0, timestamp=0) + data(4, 7, True) + build_control_batch(
           COMMIT, offset=5, producer_id=8, producer_epoch=0, timestamp=0) + build_control_batch(
           COMMIT, offset=6, producer_id=7, producer_epoch=0, timestamp=0))
    committed = [b.base_offset for b in visible_batches(iter_batches(raw), True, [(7, 0)])]
    assert committed == [1, 2, 4]  # pid 7's first transaction aborted; its second committed
    assert [b.base_offset for b in visible_batches(iter_batches(raw), False, [(7, 0)])] == [0, 1, 2, 4]


def test_arrow_batches_match_sparks_schema_and_null_headers() -> None:
    schema = SCHEMA
    raw = build_batch([Record(i, 1000 + i, b"k", b"v", [Header("a", b"1")] if i else []) for i in range(5)])
    out = list(arrow_batches(iter_batches(raw), topic="t", partition=3, start=1, end=5, include_headers=True,
                             read_committed=False, aborted=[], schema=schema, rows_per_batch=2))
    assert [b.num_rows for b in out] == [4] and all(b.schema.equals(schema) for b in out)  # whole source batches
    rows = [r for b in out for r in b.to_pylist()]
    assert [r["offset"] for r in rows] == [1, 2, 3, 4] and rows[0]["partition"] == 3
    assert rows[0]["headers"] == [{"key": "a", "value": b"1"}]
    assert round(rows[0]["timestamp"].timestamp() * 1000) == 1001
    first = list(arrow_batches(iter_batches(raw), topic="t", partition=0, start=0, end=1, include_headers=True,
                               read_committed=False, aborted=[], schema=schema))
    assert first[0].to_pylist()[0]["headers"] is None  # no headers is null, as in Spark's Kafka source


def test_byte_range_covers_the_offsets_and_little_else() -> None:
    raw = b"".join(build_batch([Record(o, 0, None, b"x" * 300) for o in range(b, b + 10)], base_offset=b)
                   for b in range(0, 2000, 10))
    seg = build_segment(raw)
    positions = {bt.base_offset: bt.pos for bt in iter_batches(raw)}
    for start, end in [(0, 10), (555, 1555), (1990, 2000), (0, 2000), (1003, 1004)]:
        lo, hi = byte_range(seg.offset_index, 0, len(raw), start, end)
        got = [o for bt in iter_batches(raw[lo:hi]) for o in range(bt.base_offset, bt.last_offset + 1)]
        assert set(range(start, end)) <= set(got)
        assert lo >= positions[start // 10 * 10] - 2 * 4096 and hi - lo <= (end - start) * 400 + 3 * 4096


def test_arrow_batches_are_bounded_by_bytes_too() -> None:
    schema = pa.schema(list(SCHEMA)[:7])
    raw = b"".join(build_batch([Record(b * 10 + i, 0, None, bytes(1000)) for i in range(10)], base_offset=b * 10)
                   for b in range(6))
    out = list(arrow_batches(iter_batches(raw), topic="t", partition=0, start=0, end=60, include_headers=False,
                             read_committed=False, aborted=[], schema=schema, bytes_per_batch=25_000))
    # three source batches (~10 KB each) reach the bound: a row cap of 8192 alone would have made one batch
    assert [b.num_rows for b in out] == [30, 30]


def test_a_corrupt_batch_raises_protocol_error_naming_it() -> None:
    from protocol.errors import ProtocolError
    raw = bytearray(build_batch([Record(i, 0, b"k", b"v" * 50) for i in range(3)], base_offset=40))
    raw[57:61] = (5).to_bytes(4, "big")  # records_count says 5 where the batch holds 3
    with pytest.raises(ProtocolError, match="batch at 40"):
        RecordColumns(want_headers=False).decode(next(iter_batches(bytes(raw))), 0, 100)


_FUZZ_BATCH = build_batch([Record(i, 5 * i, None if i == 2 else b"k%d" % i, b"v" * (40 * i),
                                  [Header("h", b"x"), Header("n", None)] if i % 2 else []) for i in range(6)])


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.integers(61, len(_FUZZ_BATCH) - 1), st.integers(0, 255)), min_size=1, max_size=6),
       st.integers(-3, 8))
def test_a_mangled_records_section_decodes_or_raises_protocol_error(edits: list[tuple[int, int]],
                                                                    count_delta: int) -> None:
    # the compiled loop does not check bounds itself: every length it is handed must be checked, or this crashes
    raw = bytearray(_FUZZ_BATCH)
    for pos, byte in edits:
        raw[pos] = byte
    raw[57:61] = (6 + count_delta).to_bytes(4, "big", signed=True)
    cols = RecordColumns(want_headers=True)
    try:
        cols.decode(next(iter_batches(bytes(raw))), 0, 1 << 62)
    except ProtocolError:
        assert len(cols) == 0  # a batch that fails adds nothing
        return
    assert len(cols) <= 6 + count_delta
    try:
        assert cols.to_arrow("t", 0, SCHEMA).num_rows == len(cols)
    except ProtocolError as exc:
        assert "not UTF-8" in str(exc)  # the one check left to Arrow


def test_a_header_key_that_is_not_utf8_is_a_protocol_error() -> None:
    raw = build_batch([Record(0, 0, None, b"v", [Header("\u00e9", b"x")])])
    bad = raw.replace("\u00e9".encode(), b"\xff\xfe")
    cols = RecordColumns(want_headers=True)
    cols.decode(next(iter_batches(bad)), 0, 1)
    with pytest.raises(ProtocolError, match="not UTF-8"):
        cols.to_arrow("t", 0, SCHEMA)


def test_slices_pack_into_input_partitions_as_spark_packs_files() -> None:
    from tierproxy.jobs.spark.slices import Slice, pack
    from tierproxy.tier.model import RemoteLogSegmentMetadata

    def seg(start: int, size: int) -> Slice:
        md = RemoteLogSegmentMetadata.__new__(RemoteLogSegmentMetadata)
        object.__setattr__(md, "segment_size_in_bytes", size)
        return Slice("t", 0, start, start + 10, md)

    mib = 1 << 20
    small = [seg(i * 10, mib) for i in range(40)]  # 5 MiB each with the open cost
    groups = pack(small, 128 * mib, None)
    assert [len(g) for g in groups] == [25, 15] and [s for g in groups for s in g] == small  # order kept
    assert len(pack(small, 128 * mib, 8)) == 8  # minPartitions: 200 MiB / 8 = 25 MiB each
    live = Slice("t", 1, 0, 5, leader="b:9092")
    big = seg(0, 32 * mib)
    assert pack([big, live, big, big, big, big], 128 * mib, None) == [(live,), (big, big, big), (big, big)]
    one = seg(0, 1)
    assert pack([one], 1, None) == [(one,)]  # a slice larger than the target still gets a partition
    assert len(pack(small, 128 * mib, 1000)) == 40  # never less than the open cost each: one slice each
