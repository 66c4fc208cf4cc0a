"""The backfill of the topic id column where a catalog's answer, not its commit, is lost (a REST catalog's
gateway timing out after the commit was applied: pyiceberg raises CommitStateUnknownException), and on a table whose
partition spec evolved; and which rows from before the column an upsert's keys compete with. Tables made as before
the column (`test_incarnations`), no broker needed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.schema import Schema

from tests.support.catalog_faults import lossy
from tierproxy.jobs.iceberg.backfill import BACKFILL, backfill
from tierproxy.jobs.iceberg.catalog import CatalogError, catalog_config, open_catalog, open_table
from tierproxy.jobs.iceberg.ledger import Ledger
from tierproxy.jobs.iceberg.schema import TOPIC_ID, iceberg_schema, partition_spec, sort_order


def _old_table(tmp_path: Path, n: int = 3) -> tuple[Any, Any]:
    cfg = catalog_config(None, f"file://{tmp_path}/tier", str(tmp_path / "state"))
    catalog = open_catalog(cfg)
    catalog.create_namespace("kafka")
    old = Schema(*(f for f in iceberg_schema().fields if f.name != TOPIC_ID))  # as tables were made before it
    table = catalog.create_table("kafka.history", schema=old, partition_spec=partition_spec(), sort_order=sort_order())
    arrow = schema_to_pyarrow(table.schema(), include_field_ids=False)
    rows = pa.Table.from_pylist([{"key": None, "value": b"v", "topic": "t", "partition": 0, "offset": o,
                                  "timestamp": o * 86_400_000_000, "timestampType": 0, "headers": [], "leaderEpoch": 0,
                                  "producerId": -1} for o in range(n)], schema=arrow)
    table.append(rows, snapshot_properties=Ledger({"T:0": n}, {}, {"t": "T"}).summary("p1", []))
    open_table(catalog, cfg, "kafka.history")  # gains the column, its rows null there
    return cfg, catalog


def test_a_backfill_whose_commit_answer_is_lost_never_removes_the_files_the_table_now_holds(tmp_path: Path) -> None:
    cfg, _ = _old_table(tmp_path)
    table = lossy(cfg, BACKFILL).load_table("kafka.history")
    try:
        done = backfill(table, "kafka.history", cfg.io, 30_000, lambda: open_catalog(cfg).load_table("kafka.history"))
    except CatalogError:
        done = None  # refused: acceptable only if the table still reads whole (below)
    table = open_catalog(cfg).load_table("kafka.history")
    applied = BACKFILL in (table.current_snapshot().summary.additional_properties or {})
    got = sorted((r["offset"], r[TOPIC_ID]) for r in table.scan().to_arrow().to_pylist())  # every file it names
    assert [o for o, _ in got] == [0, 1, 2]
    if applied:  # the swap went through: the backfill says so, the rows have their id
        assert done is not None and done.files == 1 and done.rows == 3, done
        assert {tid for _, tid in got} == {"T"}


def test_a_file_of_an_older_partition_spec_spanning_days_does_not_stop_the_backfill(tmp_path: Path) -> None:
    """Made partitioned by `partition`, then `iceberg.partition.by=partition,day(timestamp)`: a file written before
    spans three days, which no partition of the current spec holds (pyiceberg adds a file to the current spec only).
    It stays as it was and is named; the file of one day is filled; every row is still there."""
    from tierproxy.jobs.iceberg.catalog import raw_shape

    cfg, catalog = _old_table(tmp_path)  # offsets 0-2 on days 0, 1 and 2: one file
    table = catalog.load_table("kafka.history")
    arrow = schema_to_pyarrow(table.schema(), include_field_ids=False)
    one_day = pa.Table.from_pylist([{"key": None, "value": b"v", "topic": "t", "partition": 0, "offset": o,
                                     "timestamp": 5 * 86_400_000_000 + o, "timestampType": 0, "headers": [],
                                     "leaderEpoch": 0, "producerId": -1, TOPIC_ID: None} for o in (3, 4)],
                                   schema=arrow)
    table.append(one_day, snapshot_properties=Ledger({"T:0": 5}, {}, {"t": "T"}).summary("p2", []))
    table = open_table(catalog, cfg, "kafka.history", raw_shape(("partition", "day(timestamp)")), evolve_spec=True)
    assert len(table.specs()) == 2

    done = backfill(table, "kafka.history", cfg.io, 30_000, lambda: open_catalog(cfg).load_table("kafka.history"))
    got = sorted((r["offset"], r[TOPIC_ID]) for r in open_catalog(cfg).load_table("kafka.history").scan()
                 .to_arrow().to_pylist())
    assert [o for o, _ in got] == [0, 1, 2, 3, 4]
    assert done.files == 1 and done.rows == 2, done
    assert got == [(0, None), (1, None), (2, None), (3, "T"), (4, "T")]
    assert "older partition spec" in done.left["t"], done.left


def test_under_keep_a_recreated_topics_keys_leave_the_old_incarnations_rows_from_before_the_column(
        tmp_path: Path) -> None:
    """An upsert table kept (`--retention keep`) whose topic `t` (id O) was tabled before the column existed, then
    re-created (id N) after: its rows with a null id are O's (N's rows are always written with it). N's key `k`
    (a record at offset 5) must neither compete with nor delete O's row of `k` at offset 100: before, the filter the
    pass reads and deletes a key's rows by took every null row as N's, dropping N's value (its offset lost to 100)
    and deleting O's row."""
    from pyiceberg.types import BinaryType, LongType, NestedField, StringType

    from tierproxy.jobs.iceberg.upsert import KEY, OFFSET, competing
    from tierproxy.jobs.iceberg.upsert import TOPIC_ID as ID

    catalog = open_catalog(catalog_config(None, f"file://{tmp_path}/tier", str(tmp_path / "state")))
    catalog.create_namespace("kv")
    table = catalog.create_table("kv.kept", schema=Schema(
        NestedField(1, KEY, BinaryType(), required=False), NestedField(2, OFFSET, LongType(), required=False),
        NestedField(3, ID, StringType(), required=False)))
    arrow = schema_to_pyarrow(table.schema(), include_field_ids=False)
    table.append(pa.Table.from_pylist([{KEY: b"k", OFFSET: 100, ID: None}, {KEY: b"k", OFFSET: 3, ID: "N"}],
                                      schema=arrow))
    kept = Ledger({"O:0": 101, "N:0": 4}, {}, {"t": "N"}, ids={"O": "t", "N": "t"})
    assert [(r[OFFSET], r[ID]) for r in table.scan(row_filter=competing([b"k"], kept, kept, "t")).to_arrow().to_pylist()
            ] == [(3, "N")]
    alone = Ledger({"O:0": 101}, {}, {"t": "O"})  # one incarnation held: its rows from before the column are its own
    assert 100 in [r[OFFSET] for r in table.scan(row_filter=competing([b"k"], alone, alone, "t")).to_arrow()
                   .to_pylist()]


def test_the_backfill_of_a_table_no_pass_has_opened_since_the_column_came_says_so_in_one_line(
        tmp_path: Path) -> None:
    """Upgraded, then the backfill first (before any pass gave the table its column): one line naming the table and
    what to do, exit 1, the table unchanged; before, a traceback (ValueError: Could not find field)."""
    from tests.support.cli import run_cli

    cfg = catalog_config(None, f"file://{tmp_path}/tier", str(tmp_path / "state"))
    catalog = open_catalog(cfg)
    catalog.create_namespace("kafka")
    old = Schema(*(f for f in iceberg_schema().fields if f.name != TOPIC_ID))
    table = catalog.create_table("kafka.history", schema=old, partition_spec=partition_spec(), sort_order=sort_order())
    table.append(pa.Table.from_pylist([{"key": None, "value": b"v", "topic": "t", "partition": 0, "offset": 0,
                                        "timestamp": 0, "timestampType": 0, "headers": [], "leaderEpoch": 0,
                                        "producerId": -1}], schema=schema_to_pyarrow(old, include_field_ids=False)),
                 snapshot_properties=Ledger({"T:0": 1}, {}, {"t": "T"}).summary("p1", []))
    proc = run_cli("iceberg", "backfill-topic-ids", "--storage", f"file://{tmp_path}/tier", "--table", "kafka.history",
                   cwd=tmp_path, env={"TIERPROXY_TIER_STATE_DIR": str(tmp_path / "state")})
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr[-2000:]
    assert "kafka.history" in proc.stderr and TOPIC_ID in proc.stderr, proc.stderr
    assert TOPIC_ID not in {f.name for f in open_catalog(cfg).load_table("kafka.history").schema().fields}


def test_snapshot_at_refuses_a_topic_id_that_is_not_one_of_the_topics_incarnations(tmp_path: Path) -> None:
    """`--topic orders --topic-id <payments' id>`: before, the first snapshot where payments' ends passed the offsets
    was named, with a filter reading orders' rows (silently the wrong snapshot). Now one line naming the id, exit 2;
    orders' own id still answers."""
    import json

    from tests.support.cli import run_cli

    orders, payments = "A" * 22, "B" * 22
    cfg = catalog_config(None, f"file://{tmp_path}/tier", str(tmp_path / "state"))
    table = open_table(open_catalog(cfg), cfg, "kafka.history")
    for ends in ({f"{orders}:0": 10, f"{payments}:0": 1000}, {f"{orders}:0": 600, f"{payments}:0": 1000}):
        table = table.refresh()
        with table.transaction() as tx:
            tx.add_files([], snapshot_properties=Ledger(ends, {}, {"orders": orders, "payments": payments})
                         .summary("p", []))

    def at(*extra: str) -> Any:
        return run_cli("iceberg", "snapshot-at", "--storage", f"file://{tmp_path}/tier", "--topic", "orders",
                       "--offsets", '{"0": 500}', *extra, cwd=tmp_path,
                       env={"TIERPROXY_TIER_STATE_DIR": str(tmp_path / "state")})

    wrong = at("--topic-id", payments)
    assert wrong.returncode == 2, (wrong.returncode, wrong.stdout, wrong.stderr[-2000:])
    assert payments in wrong.stderr and len(wrong.stderr.strip().splitlines()) == 1, wrong.stderr[-2000:]
    right = at("--topic-id", orders)
    assert right.returncode == 0, right.stderr[-2000:]
    assert json.loads(right.stdout)["ends"] == {"0": 600}


def test_the_backfill_fills_a_kept_older_incarnations_rows_its_own_pass_appended(tmp_path: Path) -> None:
    """Kept (`--retention keep`): `t` (id O) tabled before the column, the column came, `t` re-created (id N) and
    tabled with it. The table holds two incarnations, yet each null row's is known: the pass that appended its file
    recorded which incarnation of `t` it added (its snapshot's ledger). Before, the backfill left them null (two
    incarnations), and `snapshot-at --topic-id O`'s filter (`topicId = 'O'`) read none of them."""
    cfg, catalog = _old_table(tmp_path)  # O's offsets 0-2, appended by a pass (its ledger: t → O)
    # the first pass after the column: ledger with ids, as the shipped pass records ({"O": "t"}, then N beside it)
    table = open_table(catalog, cfg, "kafka.history")
    arrow = schema_to_pyarrow(table.schema(), include_field_ids=False)
    kept = Ledger({"T:0": 3, "N:0": 2}, {}, {"t": "N"}, ids={"T": "t", "N": "t"})
    table.append(pa.Table.from_pylist([{"key": None, "value": b"n", "topic": "t", "partition": 0, "offset": o,
                                        "timestamp": 0, "timestampType": 0, "headers": [], "leaderEpoch": 0,
                                        "producerId": -1, TOPIC_ID: "N"} for o in (0, 1)], schema=arrow),
                 snapshot_properties=kept.summary("p2", []))
    done = backfill(table.refresh(), "kafka.history", cfg.io, 30_000,
                    lambda: open_catalog(cfg).load_table("kafka.history"))
    got = sorted((str(r[TOPIC_ID]), r["offset"]) for r in open_catalog(cfg).load_table("kafka.history").scan()
                 .to_arrow().to_pylist())
    assert got == [("N", 0), ("N", 1), ("T", 0), ("T", 1), ("T", 2)], (got, done)
    assert done.files == 1 and done.rows == 3 and not done.left, done


def test_under_follow_a_recreated_topics_first_pass_does_not_compete_with_the_old_incarnations_null_rows(
        tmp_path: Path) -> None:
    """Followed (`--retention follow`): `t` (id O) tabled before the column; re-created (id N), its first pass both
    removes O's rows (the tier deleted O) and adds N's, planning its upsert from the table that still holds O's row
    of `k` at offset 100 (null id). Counted as N's, it beat N's record at offset 5, which was cut, and then went
    with O's rows: `k` had no row left. The ledger the pass planned from names O current: null rows are not N's."""
    from pyiceberg.types import BinaryType, LongType, NestedField, StringType

    from tierproxy.jobs.iceberg.upsert import KEY, OFFSET, competing
    from tierproxy.jobs.iceberg.upsert import TOPIC_ID as ID

    catalog = open_catalog(catalog_config(None, f"file://{tmp_path}/tier", str(tmp_path / "state")))
    catalog.create_namespace("kv")
    table = catalog.create_table("kv.followed", schema=Schema(
        NestedField(1, KEY, BinaryType(), required=False), NestedField(2, OFFSET, LongType(), required=False),
        NestedField(3, ID, StringType(), required=False)))
    table.append(pa.Table.from_pylist([{KEY: b"k", OFFSET: 100, ID: None}],
                                      schema=schema_to_pyarrow(table.schema(), include_field_ids=False)))
    planned = Ledger({"O:0": 101}, {}, {"t": "O"})
    new = Ledger({"N:0": 6}, {}, {"t": "N"})  # O's ends and id gone with its rows (`_follow`), N's added
    assert table.scan(row_filter=competing([b"k"], planned, new, "t")).to_arrow().num_rows == 0
    same = Ledger({"O:0": 200}, {}, {"t": "O"})  # the same incarnation going on: its rows from before compete
    assert table.scan(row_filter=competing([b"k"], planned, same, "t")).to_arrow().num_rows == 1
