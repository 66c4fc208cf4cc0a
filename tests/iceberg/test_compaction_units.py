"""Small-file compaction on its own: which files are grouped, and a real pyiceberg table (the embedded SQL catalog
on a local warehouse) compacted with the rewrite run in-process: the rows, their order and the ledger unchanged."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tierproxy.jobs.iceberg.catalog import catalog_config, open_catalog, open_table
from tierproxy.jobs.iceberg.compaction import (
    COMPACTION,
    Candidate,
    CompactionOptions,
    Rewritten,
    candidates,
    compact,
    plan_groups,
)
from tierproxy.jobs.iceberg.ledger import LEDGER, WRITER, Ledger, current_ledger


def _c(partition: int, first: int, size: int) -> Candidate:
    return Candidate((0, "t", partition), first, size, 1, None)


def _firsts(groups: list[list[Candidate]]) -> list[list[int]]:
    return [[c.first_offset for c in g] for g in groups]


@pytest.mark.parametrize(("files", "options", "groups"), [
    ([], CompactionOptions(100, 2), []),
    ([_c(0, 0, 10), _c(0, 10, 10)], CompactionOptions(100, 2), [[0, 10]]),
    ([_c(0, 0, 10), _c(0, 10, 10)], CompactionOptions(100, 3), []),  # fewer than the minimum: left
    ([_c(0, 10, 10), _c(0, 0, 10), _c(0, 20, 10)], CompactionOptions(100, 2), [[0, 10, 20]]),  # offset order
    ([_c(0, 0, 10), _c(0, 10, 80), _c(0, 20, 10)], CompactionOptions(100, 2), [[0, 20]]),  # 80 ≥ 3/4: not small
    ([_c(0, 0, 10), _c(1, 0, 10), _c(0, 10, 10), _c(1, 10, 10)], CompactionOptions(100, 2),
     [[0, 10], [0, 10]]),  # never across partitions
    ([_c(0, i * 10, 40) for i in range(5)], CompactionOptions(100, 2), [[0, 10], [20, 30]]),  # ≤ target; 1 left
    # size-tiered: an earlier compaction's file is merged again only once as much has come beside it
    ([_c(0, 0, 50), *[_c(0, 10 + i, 10) for i in range(4)]], CompactionOptions(100, 2), [[10, 11, 12, 13]]),
    ([_c(0, 0, 50), *[_c(0, 10 + i, 10) for i in range(5)]], CompactionOptions(100, 2), [[0, 10, 11, 12, 13, 14]]),
    ([_c(0, 0, 50), _c(0, 10, 20), *[_c(0, 20 + i, 5) for i in range(3)]], CompactionOptions(100, 3),
     [[20, 21, 22]]),  # each larger file waits: the smallest are merged first
    ([_c(0, i, 1) for i in range(200)], CompactionOptions(64, 5), [list(range(k, min(k + 64, 200)))
                                                                  for k in range(0, 200, 64)]),  # the last 8 too
    ([_c(0, 0, 10), _c(0, 10, 10)], CompactionOptions(0, 2), []),  # 0: compaction off
])
def test_which_files_are_merged(files: list[Candidate], options: CompactionOptions, groups: list[list[int]]) -> None:
    assert _firsts(plan_groups(files, options)) == groups


def _in_process(fn: Any, jobs: list[Any]) -> list[Rewritten]:
    return [fn(j) for j in jobs]


@pytest.fixture
def raw_table(tmp_path: Path) -> Any:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyiceberg.io.pyarrow import schema_to_pyarrow

    cfg = catalog_config(None, f"file://{tmp_path}/tier", str(tmp_path / "state"))
    table = open_table(open_catalog(cfg), cfg, "kafka.history")
    arrow = schema_to_pyarrow(table.schema())
    for p in (0, 1):
        Path(f"{table.location().removeprefix('file://')}/data/topic=t/partition={p}").mkdir(parents=True)
        for first in range(0, 120, 10):  # 12 small files per partition, appended out of offset order
            first = (first * 7) % 120
            rows = [{"key": None, "value": f"{p}-{o}".encode(), "topic": "t", "partition": p, "offset": o,
                     "timestamp": 1_700_000_000_000_000 + o, "timestampType": 0,
                     "headers": None if o % 3 else [{"key": "h", "value": b"v"}],  # a record without headers: null
                     "leaderEpoch": 0, "producerId": -1} for o in range(first, first + 10)]
            # written as the pass writes them (pyarrow, field ids), then added: pyiceberg's own append would write
            # a null headers list as []
            path = f"{table.location()}/data/topic=t/partition={p}/{first:020d}-seg-0-p0.parquet"
            pq.write_table(pa.Table.from_pylist(rows, schema=arrow), path.removeprefix("file://"))
            with table.transaction() as tx:
                tx.add_files([path])
                tx.set_properties({LEDGER: Ledger({"id:0": 120}, {}, {"t": "id"}).property()})
            table = table.refresh()
    return table


def _rows(table: Any) -> list[tuple[int, int, bytes]]:
    t = table.scan().to_arrow()
    return sorted(zip(t.column("partition").to_pylist(), t.column("offset").to_pylist(), t.column("value").to_pylist(),
                      strict=True))


def _headers_as_written(table: Any) -> list[Any]:
    """Each data file's headers column read straight from the file (pyiceberg's scan reads a null list as [])."""
    import pyarrow.parquet as pq

    out: list[Any] = []
    for task in table.scan().plan_files():
        t = pq.read_table(task.file.file_path.removeprefix("file://"), columns=["partition", "offset", "headers"])
        out.extend(zip(t.column("partition").to_pylist(), t.column("offset").to_pylist(),
                       t.column("headers").to_pylist(), strict=True))
    return sorted(out, key=lambda r: (r[0], r[1]))


def test_a_compacted_table_has_the_same_rows_in_fewer_files(raw_table: Any) -> None:
    table = raw_table
    before, ledger, headers = _rows(table), current_ledger(table), _headers_as_written(table)
    assert headers[1][2] is None and headers[0][2] == [{"key": "h", "value": b"v"}]
    assert len(candidates(table, "offset")) == 24
    with table.transaction() as tx:
        tx.set_properties({WRITER: "p1 0"})  # the caller's lease: the commit releases it
    table = table.refresh()
    done = compact(table, "offset", CompactionOptions(1 << 20, 5), "p1", {}, _in_process, {"x": "y"})
    table = table.refresh()
    assert (done.files_in, done.files_out, done.rows, done.skipped) == (24, 2, 240, None)
    assert _rows(table) == before and _headers_as_written(table) == headers  # a null stays a null
    files = candidates(table, "offset")
    assert sorted(c.partition[1:] for c in files) == [("t", 0), ("t", 1)]
    for c in files:  # one file per partition, its rows in offset order
        t = table.scan(row_filter=f"partition = {c.partition[2]}").to_arrow()
        assert t.column("offset").to_pylist() == list(range(120))
        assert c.file.file_path.endswith("-p1.parquet") and c.first_offset == 0
    summary = table.current_snapshot().summary.additional_properties
    assert summary[COMPACTION] == "p1" and summary["x"] == "y"
    assert WRITER not in table.properties and current_ledger(table).ends == ledger.ends
    # a second compaction finds nothing to merge and commits nothing
    snap = table.current_snapshot().snapshot_id
    assert compact(table, "offset", CompactionOptions(1 << 20, 5), "p2", {}, _in_process, {}).files_in == 0
    assert table.refresh().current_snapshot().snapshot_id == snap


def test_a_rewrite_that_loses_rows_is_not_committed(raw_table: Any) -> None:
    table = raw_table
    snap, before = table.current_snapshot().snapshot_id, _rows(table)
    written: list[str] = []

    def short(fn: Any, jobs: list[Any]) -> list[Rewritten]:
        out = [fn(j) for j in jobs]
        written.extend(o.path for o in out if o.path)
        return [Rewritten(o.path, o.rows - 1) for o in out]  # as if a row went missing on the way

    done = compact(table, "offset", CompactionOptions(1 << 20, 5), "p3", {}, short, {})
    assert done.files_in == 0 and done.skipped == "119 rows written for 120 read"
    table = table.refresh()
    assert table.current_snapshot().snapshot_id == snap and _rows(table) == before
    assert written and not any(Path(p.removeprefix("file://")).exists() for p in written)


def test_a_commit_after_another_writers_append_keeps_its_rows(raw_table: Any) -> None:
    import pyarrow as pa
    from pyiceberg.io.pyarrow import schema_to_pyarrow

    table = raw_table

    def append() -> None:  # another writer commits between the rewrite and this commit
        other = table.refresh()
        arrow = schema_to_pyarrow(other.schema(), include_field_ids=False)
        other.append(pa.Table.from_pylist([{"key": None, "value": b"late", "topic": "t", "partition": 0,
                                            "offset": 500, "timestamp": 0, "timestampType": 0, "headers": [],
                                            "leaderEpoch": 0, "producerId": -1}], schema=arrow))

    done = compact(table, "offset", CompactionOptions(1 << 20, 5), "p4", {}, _in_process, {}, before_commit=append)
    assert (done.files_in, done.files_out) == (24, 2)  # pyiceberg rebases the swap onto the append
    table = table.refresh()
    assert len(_rows(table)) == 241 and (0, 500, b"late") in _rows(table) and len(candidates(table, "offset")) == 3


def test_a_commit_after_another_writer_removed_an_input_changes_nothing(raw_table: Any) -> None:
    table = raw_table

    def purge() -> None:  # a pass following the tier rewrites the first file between the rewrite and this commit
        table.refresh().delete("partition = 0 AND offset < 5")

    done = compact(table, "offset", CompactionOptions(1 << 20, 5), "p5", {}, _in_process, {}, before_commit=purge)
    assert done.files_in == 0 and done.skipped is not None and "Missing required files to delete" in done.skipped
    table = table.refresh()
    assert len(_rows(table)) == 235 and len(candidates(table, "offset")) == 24
    assert not [p for p in (Path(table.location().removeprefix("file://")) / "data").rglob("*compacted*")]


def test_files_of_an_earlier_partition_spec_are_left_as_they_are(raw_table: Any) -> None:
    from tierproxy.jobs.iceberg.catalog import catalog_config, open_catalog, open_table, raw_shape

    table = raw_table
    location = Path(table.location().removeprefix("file://"))
    tmp = location.parents[3]  # <tmp>/tier/iceberg/kafka/history
    cfg = catalog_config(None, f"file://{tmp}/tier", str(tmp / "state"))
    table = open_table(open_catalog(cfg), cfg, "kafka.history", raw_shape(("partition", "day(timestamp)")),
                       evolve_spec=True)
    assert table.spec().spec_id != 0
    assert candidates(table, "offset") == []  # every file is of spec 0: none may be merged under the new spec
    done = compact(table, "offset", CompactionOptions(1 << 20, 5), "p6", {}, _in_process, {})
    assert done.files_in == 0 and len(list(table.refresh().scan().plan_files())) == 24


def test_a_file_from_before_an_evolution_is_cast_to_the_current_columns() -> None:
    import pyarrow as pa

    from tierproxy.jobs.iceberg.compaction import conform

    old = pa.RecordBatch.from_pylist([{"id": 1, "qty": 5}, {"id": 2, "qty": None}],
                                     schema=pa.schema([("id", pa.int64()), ("qty", pa.int32())]))
    now = pa.schema([pa.field("id", pa.int64(), False), ("qty", pa.int64()), ("note", pa.string())])
    assert conform(old, now).to_pylist() == [{"id": 1, "qty": 5, "note": None}, {"id": 2, "qty": None, "note": None}]
    with pytest.raises(ValueError, match="no column must, which is required"):
        conform(old, pa.schema([*now, pa.field("must", pa.int64(), False)]))


def test_a_compaction_whose_commit_answer_is_lost_never_removes_the_files_the_table_now_holds(
        raw_table: Any, tmp_path: Path) -> None:
    """The catalog applied the swap, its answer was lost (a gateway timeout: CommitStateUnknownException): before,
    the compaction deleted its new files as if nothing were committed, and the table named files that were gone."""
    from tests.support.catalog_faults import lossy

    cfg = catalog_config(None, f"file://{tmp_path}/tier", str(tmp_path / "state"))
    before = _rows(raw_table)
    table = lossy(cfg, COMPACTION).load_table("kafka.history")
    done = compact(table, "offset", CompactionOptions(1 << 20, 5), "p9", {}, _in_process, {})
    table = open_catalog(cfg).load_table("kafka.history")
    applied = table.current_snapshot().summary.additional_properties.get(COMPACTION) == "p9"
    assert _rows(table) == before  # every file the table names is there
    if applied:
        assert (done.files_in, done.files_out) == (24, 2), done
