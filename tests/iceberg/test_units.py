"""The Iceberg step's rules on their own: which transactions hold a partition back, what a slice reports of the
transactions it saw, the ledger in snapshot summaries, the schema check."""

from __future__ import annotations

import re
from typing import Any

import pytest

from protocol.records import ABORT, COMMIT, Record, build_batch, build_control_batch, iter_batches
from tierproxy.jobs.iceberg.files import SliceWritten, TransactionTracker
from tierproxy.jobs.iceberg.ledger import Ledger, ledger_of
from tierproxy.jobs.iceberg.schema import ADDED, TOPIC_ID, iceberg_schema, same_columns
from tierproxy.jobs.iceberg.sync import held_back_from


def _slice(opens: dict[Any, int], closes: list[int]) -> SliceWritten:
    return SliceWritten((), opens=opens, closes=closes)


@pytest.mark.parametrize(("slices", "held"), [
    ([], None),
    ([_slice({}, [])], None),
    ([_slice({7: 10}, [])], 10),  # open at the end: held from its first offset
    ([_slice({7: 10}, []), _slice({}, [7])], None),  # its marker in a later slice: known
    ([_slice({7: 10}, []), _slice({7: 55}, [])], 10),  # still open: the earliest first offset counts
    ([_slice({7: 10}, []), _slice({7: 60}, [7])], 60),  # closed, then a new transaction of the same producer
    ([_slice({7: 5}, []), _slice({8: 20}, [7])], 20),  # only the other producer's stays open
    ([_slice({7: 5}, []), _slice({7: 30}, [7])], 30),  # a marker, then the same producer's next transaction
    ([_slice({7: 10}, []), _slice({8: 30}, [7]), _slice({}, [8])], None),
    ([_slice({"7": 10}, []), _slice({}, [7])], None),  # producer ids as JSON keys (strings) from the executors
])
def test_held_back_from(slices: list[SliceWritten], held: int | None) -> None:
    assert held_back_from(slices) == held


def _data(offset: int, pid: int, transactional: bool = True) -> bytes:
    return build_batch([Record(offset, 0, None, b"v")], base_offset=offset, producer_id=pid, producer_epoch=0,
                       transactional=transactional)


def test_a_slice_reports_open_transactions_and_markers() -> None:
    raw = b"".join([_data(0, 7), _data(1, 8), build_control_batch(COMMIT, offset=2, producer_id=7,
                                                                    producer_epoch=0, timestamp=0),
                    _data(3, 9, transactional=False), _data(4, 7), build_control_batch(ABORT, offset=5,
                                                                                       producer_id=8,
                                                                                       producer_epoch=0,
                                                                                       timestamp=0)])
    tracker = TransactionTracker()
    seen = list(tracker.see(iter_batches(raw)))
    assert len(seen) == 6  # every batch passes through
    assert tracker.opens == {7: 4} and tracker.closes == {7, 8}


def test_the_ledger_round_trips_through_a_snapshot_summary() -> None:
    from pyiceberg.table.snapshots import Operation, Snapshot, Summary

    led = Ledger({"id:0": 120}, {"id:0": 40}, {"orders": "id"})
    props = led.summary("pass1", ["seg-a", "seg-b"])
    snap = Snapshot(snapshot_id=5, sequence_number=1, timestamp_ms=0, manifest_list="m",
                    summary=Summary(Operation.APPEND, **props))
    back = ledger_of(snap)
    assert back is not None and (back.ends, back.starts, back.topics) == (led.ends, led.starts, led.topics)
    assert props["tierproxy.segments"] == "seg-a,seg-b"
    foreign = Snapshot(snapshot_id=6, sequence_number=2, timestamp_ms=0, manifest_list="m",
                       summary=Summary(Operation.APPEND))
    assert ledger_of(foreign) is None  # another writer's commit carries no ledger: skipped


def test_the_schema_check_ignores_field_ids_but_not_columns() -> None:
    from pyiceberg.schema import Schema
    from pyiceberg.types import BinaryType, NestedField

    ours = iceberg_schema()
    assert same_columns(ours, ours)
    renumbered = Schema(*(NestedField(f.field_id + 100, f.name, f.field_type, required=f.required)
                          for f in ours.fields))
    assert same_columns(ours, renumbered)
    fewer = Schema(*(f for f in ours.fields if f.name != "producerId"))
    assert not same_columns(ours, fewer)
    other = Schema(*(NestedField(99, "producerId", BinaryType(), required=True) if f.name == "producerId" else f
                     for f in ours.fields))
    assert not same_columns(ours, other)
    # a table made before the topic id column matches, and one that gained it last by evolution
    before = Schema(*(f for f in ours.fields if f.name != TOPIC_ID))
    assert not same_columns(before, ours) and same_columns(before, ours, ADDED)
    from pyiceberg.types import StringType

    from tierproxy.jobs.iceberg.typed import dlq_schema

    evolved_dlq = Schema(*before.fields, NestedField(15, "error", StringType(), required=True),
                         ours.find_field(TOPIC_ID))
    assert same_columns(evolved_dlq, dlq_schema(), ADDED) and not same_columns(evolved_dlq, dlq_schema())


def test_the_slices_of_a_segment_are_accepted_in_byte_order() -> None:
    """Four slices of one segment: a transaction opens in the one at byte 20,000 and its marker is in the one at
    byte 100,000. Ordered by path (whose byte offset is not zero-padded, "-100000-" before "-20000-"), the marker
    came first and the partition was held back for good; ordered by byte offset, every outcome is known."""
    from types import SimpleNamespace

    from tierproxy.jobs.iceberg.sync import RAW_COLUMNS, IcebergSync, _rows, _Target

    def result(byte: int, opens: dict[int, int], closes: list[int]) -> SliceWritten:
        return SliceWritten((f"data/00000000000000000000-seg-{byte}-pass.parquet",), rows=1, topic="t", partition=0,
                            topic_id="id", segment="seg", start=0, segment_end=99, byte_start=byte, opens=opens,
                            closes=closes)

    results = [result(b, o, c) for b, o, c in ((100_000, {}, [7]), (0, {}, []), (3_000_000, {}, []),
                                                (20_000, {7: 40}, []))]
    assert sorted(r.paths[0] for r in results)[0].endswith("-0-pass.parquet")  # "-0-", "-100000-", "-20000-", ...
    sync = IcebergSync(SimpleNamespace(read_committed=True), spark=None)  # type: ignore[arg-type]
    target = _Target("t", None, RAW_COLUMNS, _rows, new=Ledger())
    accepted = sync._accept(results, target, {("t", 0): None})
    assert target.new is not None
    assert accepted.rejected == [] and target.new.ends == {"id:0": 100}
    assert accepted.paths == [f"data/00000000000000000000-seg-{b}-pass.parquet"
                              for b in (0, 20_000, 100_000, 3_000_000)]


def test_a_table_whose_ledger_is_ahead_takes_nothing_twice() -> None:
    """A typed table's dead letters committed, its rows not (a pass killed between the two commits): the next pass
    writes both tables' files again; the dead-letter table refuses the segments its ledger has, the other takes
    them."""
    from types import SimpleNamespace

    from tierproxy.jobs.iceberg.sync import RAW_COLUMNS, IcebergSync, _dead_letters, _rows, _Target

    results = [SliceWritten((f"rows-{s}",), rows=10, topic="t", partition=0, topic_id="id", segment=f"s{s}",
                            start=s * 100, segment_end=s * 100 + 99, dlq_paths=(f"dead-{s}",), dlq_rows=2)
               for s in range(3)]
    sync = IcebergSync(SimpleNamespace(read_committed=True), spark=None)  # type: ignore[arg-type]
    ahead = Ledger({"id:0": 200}, {}, {"t": "id"})
    dead = _Target("t_dlq", None, RAW_COLUMNS, _dead_letters, ledger=ahead, new=Ledger(dict(ahead.ends), {},
                                                                                        dict(ahead.topics)))
    rows = _Target("t", None, RAW_COLUMNS, _rows, new=Ledger())
    took_dead, took_rows = sync._accept(results, dead, {}), sync._accept(results, rows, {})
    assert took_dead.paths == ["dead-2"] and took_dead.rejected == ["dead-0", "dead-1"] and took_dead.rows == 2
    assert took_rows.paths == ["rows-0", "rows-1", "rows-2"] and took_rows.rows == 30
    assert dead.new is not None and rows.new is not None and dead.new.ends == rows.new.ends == {"id:0": 300}


def test_a_data_file_exists_only_for_rows_and_a_failed_slice_leaves_none(tmp_path: Any) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyiceberg.io import load_file_io

    from tierproxy.jobs.iceberg.files import LazyParquet

    schema = pa.schema([("v", pa.int64())])
    io = load_file_io(location=str(tmp_path))
    empty = LazyParquet(io, f"file://{tmp_path}/empty.parquet", schema)
    empty.write(pa.RecordBatch.from_pylist([], schema=schema))
    assert empty.close() is None and not (tmp_path / "empty.parquet").exists()

    kept = LazyParquet(io, f"file://{tmp_path}/kept.parquet", schema)
    kept.write(pa.RecordBatch.from_pylist([{"v": 1}, {"v": 2}], schema=schema))
    kept.write(pa.RecordBatch.from_pylist([{"v": 3}], schema=schema))
    assert kept.close() == f"file://{tmp_path}/kept.parquet" and kept.rows == 3
    assert pq.read_table(tmp_path / "kept.parquet").column("v").to_pylist() == [1, 2, 3]

    failed = LazyParquet(io, f"file://{tmp_path}/failed.parquet", schema)
    failed.write(pa.RecordBatch.from_pylist([{"v": 1}], schema=schema))
    assert (tmp_path / "failed.parquet").exists()
    assert failed.close(discard=True) is None and not (tmp_path / "failed.parquet").exists()


DAY_US = 86_400_000_000


def test_a_slice_split_by_day_writes_a_file_per_day_its_rows_in_order_and_bounded(tmp_path: Any) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyiceberg.io import load_file_io

    from tierproxy.jobs.iceberg.files import SplitParquet

    schema = pa.schema([("offset", pa.int64()), ("timestamp", pa.timestamp("us", "UTC"))])
    io = load_file_io(location=str(tmp_path))
    out = SplitParquet(io, f"file://{tmp_path}/0-seg-0-pass1.parquet", schema, ("timestamp", DAY_US))
    days = [0, 0, 1, -1, 1, 2, 0]  # out of order, one before 1970 (day -1)
    rows = [{"offset": i, "timestamp": d * DAY_US + i} for i, d in enumerate(days)]
    out.write(pa.RecordBatch.from_pylist(rows[:4], schema=schema))
    out.write(pa.RecordBatch.from_pylist(rows[4:], schema=schema))
    assert out.rows == 7
    paths = out.close()
    assert out.rows == 7  # still, once closed (what the slice reports)
    assert sorted(paths) == sorted(f"file://{tmp_path}/0-seg-0-t{d}-pass1.parquet" for d in (-1, 0, 1, 2))
    for d in (-1, 0, 1, 2):
        t = pq.read_table(tmp_path / f"0-seg-0-t{d}-pass1.parquet")
        assert t.column("offset").to_pylist() == [i for i, day in enumerate(days) if day == d]

    # more buckets than may be open at once: the least recently written is closed, a later row of it gets another
    many = SplitParquet(io, f"file://{tmp_path}/m-pass2.parquet", schema, ("timestamp", DAY_US))
    order = [*range(SplitParquet.MAX_OPEN + 2), 0]
    for i, d in enumerate(order):
        many.write(pa.RecordBatch.from_pylist([{"offset": i, "timestamp": d * DAY_US}], schema=schema))
        assert len(many._open) <= SplitParquet.MAX_OPEN
    written = many.close()
    assert many.rows == len(order) == len(written) and f"file://{tmp_path}/m-t0.1-pass2.parquet" in written
    assert sum(pq.read_table(p.removeprefix("file://")).num_rows for p in written) == len(order)

    failed = SplitParquet(io, f"file://{tmp_path}/f-pass3.parquet", schema, ("timestamp", DAY_US))
    failed.write(pa.RecordBatch.from_pylist(rows, schema=schema))
    assert failed.close(discard=True) == () and not list(tmp_path.glob("f-*"))


@pytest.mark.parametrize(("by", "fields"), [
    ("partition", [("topic", "identity", "topic"), ("partition", "identity", "partition")]),
    ("day(timestamp)", [("topic", "identity", "topic"), ("timestamp", "day", "timestamp_day")]),
    ("partition, HOUR(timestamp)", [("topic", "identity", "topic"), ("partition", "identity", "partition"),
                                    ("timestamp", "hour", "timestamp_hour")]),
])
def test_partition_by_makes_the_raw_tables_spec(by: str, fields: list[tuple[str, str, str]]) -> None:
    from tierproxy.config.values import partition_by_fields
    from tierproxy.jobs.iceberg.schema import partition_spec, spec_fields, time_bucket

    spec = partition_spec(partition_by_fields(by))
    assert spec_fields(spec, iceberg_schema()) == fields
    unit = {"day": DAY_US, "hour": 3_600_000_000}
    assert time_bucket(spec, iceberg_schema()) == next((("timestamp", unit[t]) for _, t, _ in fields if t in unit),
                                                       None)


@pytest.mark.parametrize(("by", "why"), [
    ("", "no entry"), ("week(timestamp)", "entry 'week(timestamp)': not one of"),
    ("day(timestamp),hour(timestamp)", "not both"), ("partition,partition", "at most once"),
])
def test_a_wrong_partition_by_is_refused_naming_it(by: str, why: str) -> None:
    from tierproxy.config.values import partition_by_fields

    with pytest.raises(ValueError, match=re.escape(why)):
        partition_by_fields(by)


def test_an_existing_tables_spec_evolves_to_partition_by_and_keeps_its_files(tmp_path: Any) -> None:
    import pyarrow as pa
    from pyiceberg.io.pyarrow import schema_to_pyarrow

    from tierproxy.jobs.iceberg.catalog import catalog_config, open_catalog, open_table, raw_shape
    from tierproxy.jobs.iceberg.schema import spec_fields

    cfg = catalog_config(None, f"file://{tmp_path}/tier", str(tmp_path / "state"))
    catalog = open_catalog(cfg)
    table = open_table(catalog, cfg, "kafka.history")
    row = {"key": None, "value": b"v", "topic": "t", "partition": 0, "offset": 0, "timestamp": 0,
           "timestampType": 0, "headers": [], "leaderEpoch": 0, "producerId": -1}
    table.append(pa.Table.from_pylist([row], schema=schema_to_pyarrow(table.schema(), include_field_ids=False)))
    by_day = raw_shape(("partition", "day(timestamp)"))
    assert open_table(catalog, cfg, "kafka.history", by_day).spec().spec_id == 0  # opening alone changes nothing
    table = open_table(catalog, cfg, "kafka.history", by_day, evolve_spec=True)
    assert [f[2] for f in spec_fields(table.spec(), table.schema())] == ["topic", "partition", "timestamp_day"]
    assert [t.file.spec_id for t in table.scan().plan_files()] == [0]  # its file keeps the spec it was written in
    assert table.scan().to_arrow().num_rows == 1
    again = open_table(catalog, cfg, "kafka.history", raw_shape(("day(timestamp)", "partition")), evolve_spec=True)
    assert again.spec().spec_id == table.spec().spec_id  # the same fields in another order: no new spec
