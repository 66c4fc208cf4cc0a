"""The DataFrame reader's pure parts, without Spark: option parsing, record decoding into columns (checked against
`protocol.records`), the read_committed filter and the byte range an offset range needs."""

from __future__ import annotations

import pytest

from protocol import compression
from protocol.records import ABORT, COMMIT, Header, Record, build_batch, build_control_batch, iter_batches
from tierproxy.spark.options import OptionError, parse_options
from tierproxy.spark.rows import Columns, arrow_batches, decode_batch_into, visible_batches
from tierproxy.spark.source import byte_range
from tierproxy.tier.indexes import build_segment

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
    cols = Columns()
    decode_batch_into(batch, cols, 110, 390, True)
    want = [r for r in batch.records() if 110 <= r.offset < 390]
    assert cols.offsets == [r.offset for r in want] == list(range(110, 390))
    assert cols.keys == [r.key for r in want] and cols.values == [r.value for r in want]
    assert cols.timestamps == [r.timestamp for r in want]
    assert cols.ts_types == [1 if log_append else 0] * 280
    assert cols.headers == [[(h.key, h.value) for h in r.headers] for r in want]


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
    import pyarrow as pa

    schema = pa.schema([("key", pa.binary()), ("value", pa.binary()), ("topic", pa.string()),
                        ("partition", pa.int32()), ("offset", pa.int64()), ("timestamp", pa.timestamp("us", "UTC")),
                        ("timestampType", pa.int32()),
                        ("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())])))])
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
    import pyarrow as pa

    schema = pa.schema([("key", pa.binary()), ("value", pa.binary()), ("topic", pa.string()),
                        ("partition", pa.int32()), ("offset", pa.int64()), ("timestamp", pa.timestamp("us", "UTC")),
                        ("timestampType", pa.int32())])
    raw = b"".join(build_batch([Record(b * 10 + i, 0, None, bytes(1000)) for i in range(10)], base_offset=b * 10)
                   for b in range(6))
    out = list(arrow_batches(iter_batches(raw), topic="t", partition=0, start=0, end=60, include_headers=False,
                             read_committed=False, aborted=[], schema=schema, bytes_per_batch=25_000))
    # three source batches (~10 KB each) reach the bound: a row cap of 8192 alone would have made one batch
    assert [b.num_rows for b in out] == [30, 30]


def test_a_corrupt_batch_raises_protocol_error_naming_it() -> None:
    from protocol.errors import ProtocolError
    from tierproxy.spark.rows import Columns, decode_batch_into

    raw = bytearray(build_batch([Record(i, 0, b"k", b"v" * 50) for i in range(3)], base_offset=40))
    raw[57:61] = (5).to_bytes(4, "big")  # records_count says 5 where the batch holds 3
    with pytest.raises(ProtocolError, match="batch at 40"):
        decode_batch_into(next(iter_batches(bytes(raw))), Columns(), 0, 100, False)
