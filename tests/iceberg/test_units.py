"""The Iceberg step's rules on their own: which transactions hold a partition back, what a slice reports of the
transactions it saw, the ledger in snapshot summaries, the schema check."""

from __future__ import annotations

from typing import Any

import pytest

from protocol.records import ABORT, COMMIT, Record, build_batch, build_control_batch, iter_batches
from tierproxy.iceberg.files import SliceWritten, TransactionTracker
from tierproxy.iceberg.ledger import Ledger, ledger_of
from tierproxy.iceberg.schema import iceberg_schema, same_columns
from tierproxy.iceberg.sync import held_back_from


def _slice(opens: dict[Any, int], closes: list[int]) -> SliceWritten:
    return SliceWritten(None, opens=opens, closes=closes)


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
    fewer = Schema(*ours.fields[:-1])
    assert not same_columns(ours, fewer)
    other = Schema(*ours.fields[:-1], NestedField(99, "producerId", BinaryType(), required=True))
    assert not same_columns(ours, other)


def test_the_slices_of_a_segment_are_accepted_in_byte_order() -> None:
    """Four slices of one segment: a transaction opens in the one at byte 20,000 and its marker is in the one at
    byte 100,000. Ordered by path (whose byte offset is not zero-padded, "-100000-" before "-20000-"), the marker
    came first and the partition was held back for good; ordered by byte offset, every outcome is known."""
    from types import SimpleNamespace

    from tierproxy.iceberg.sync import RAW_COLUMNS, IcebergSync, _rows, _Target

    def result(byte: int, opens: dict[int, int], closes: list[int]) -> SliceWritten:
        return SliceWritten(f"data/00000000000000000000-seg-{byte}-pass.parquet", rows=1, topic="t", partition=0,
                            topic_id="id", segment="seg", start=0, segment_end=99, byte_start=byte, opens=opens,
                            closes=closes)

    results = [result(b, o, c) for b, o, c in ((100_000, {}, [7]), (0, {}, []), (3_000_000, {}, []),
                                                (20_000, {7: 40}, []))]
    assert sorted(str(r.path) for r in results)[0].endswith("-0-pass.parquet")  # "-0-", "-100000-", "-20000-", ...
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

    from tierproxy.iceberg.sync import RAW_COLUMNS, IcebergSync, _dead_letters, _rows, _Target

    results = [SliceWritten(f"rows-{s}", rows=10, topic="t", partition=0, topic_id="id", segment=f"s{s}", start=s * 100,
                            segment_end=s * 100 + 99, dlq_path=f"dead-{s}", dlq_rows=2) for s in range(3)]
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

    from tierproxy.iceberg.files import LazyParquet

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
