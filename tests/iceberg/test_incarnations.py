"""Incarnations kept apart (issue 67, item 2), on their own: a table made before the topic id column gains it by
schema evolution (its rows and files as they were, null there), and the ledger records every incarnation held.
End to end (a topic re-created under `--retention keep`): tests/iceberg/test_lifecycle.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.schema import Schema

from tierproxy.jobs.iceberg.catalog import TableShape, catalog_config, open_catalog, open_table, raw_shape
from tierproxy.jobs.iceberg.ledger import Ledger, current_ledger
from tierproxy.jobs.iceberg.schema import TOPIC_ID, iceberg_schema, partition_spec, sort_order
from tierproxy.jobs.iceberg.typed import dlq_schema
from tierproxy.jobs.iceberg.typed_tables import TypedOptions, _dlq_shape


def test_a_table_made_before_the_topic_id_column_gains_it_and_keeps_its_rows(tmp_path: Path) -> None:
    cfg = catalog_config(None, f"file://{tmp_path}/tier", str(tmp_path / "state"))
    catalog = open_catalog(cfg)
    catalog.create_namespace("kafka")
    for name, full in (("kafka.history", iceberg_schema()), ("kafka.orders_dlq", dlq_schema())):
        old = Schema(*(f for f in full.fields if f.name != TOPIC_ID))  # as tables were made before it
        table = catalog.create_table(name, schema=old, partition_spec=partition_spec(), sort_order=sort_order())
        row = {"key": None, "value": b"v", "topic": "t", "partition": 0, "offset": 0, "timestamp": 0,
               "timestampType": 0, "headers": [], "leaderEpoch": 0, "producerId": -1, "error": "bad"}
        arrow = schema_to_pyarrow(table.schema(), include_field_ids=False)
        table.append(pa.Table.from_pylist([{k: v for k, v in row.items() if k in arrow.names}], schema=arrow))
        files = [t.file.file_path for t in table.scan().plan_files()]

        opened = open_table(catalog, cfg, name, dlq_shape() if name.endswith("_dlq") else raw())
        assert opened.schema().find_field(TOPIC_ID).required is False
        assert [t.file.file_path for t in opened.scan().plan_files()] == files, "no file rewritten"
        assert opened.scan().to_arrow().column(TOPIC_ID).to_pylist() == [None]
        again = open_table(catalog, cfg, name, dlq_shape() if name.endswith("_dlq") else raw())
        assert again.metadata.current_schema_id == opened.metadata.current_schema_id  # evolved once


def raw() -> TableShape:
    return raw_shape()


def dlq_shape() -> TableShape:
    return _dlq_shape(("partition",), TypedOptions(None, "orders-value", value_format="string"), None)


def test_the_ledger_records_every_incarnation_it_holds(tmp_path: Path) -> None:
    before = Ledger({"old:0": 2000}, {}, {"t": "old"})  # a ledger from before `ids`: its current incarnation
    assert before.incarnations("t") == ["old"]
    kept = before.copy()
    kept.topics["t"], kept.ids["new"] = "new", "t"  # the topic re-created, kept beside (--retention keep)
    kept.ends["new:0"] = 500
    assert kept.incarnations("t") == ["new", "old"] and before.incarnations("t") == ["old"]
    cfg = catalog_config(None, f"file://{tmp_path}/tier", str(tmp_path / "state"))
    table = open_table(open_catalog(cfg), cfg, "kafka.history")
    with table.transaction() as tx:
        tx.set_properties({"tierproxy.ledger": kept.property()})
    assert current_ledger(table.refresh()).ids == {"old": "t", "new": "t"}


def test_the_backfill_fills_the_id_where_the_ledger_knows_it_and_leaves_kept_incarnations_named(
        tmp_path: Path) -> None:
    """`t` has one incarnation: its rows get its id. `k` was re-created under keep before the column existed, and its
    files compacted: both incarnations' offset 0 is a row, nothing tells them apart, so they stay null and `k` is
    named."""
    import json

    from tierproxy.jobs.iceberg.backfill import backfill
    from tierproxy.jobs.iceberg.catalog import CatalogError
    from tierproxy.jobs.iceberg.ledger import LEDGER, WRITER
    from tierproxy.jobs.iceberg.writer import Lease

    cfg = catalog_config(None, f"file://{tmp_path}/tier", str(tmp_path / "state"))
    catalog = open_catalog(cfg)
    catalog.create_namespace("kafka")
    old = Schema(*(f for f in iceberg_schema().fields if f.name != TOPIC_ID))
    table = catalog.create_table("kafka.history", schema=old, partition_spec=partition_spec(), sort_order=sort_order())
    arrow = schema_to_pyarrow(table.schema(), include_field_ids=False)

    def rows(topic: str, n: int) -> pa.Table:
        return pa.Table.from_pylist([{"key": None, "value": b"v", "topic": topic, "partition": 0, "offset": o,
                                      "timestamp": 0, "timestampType": 0, "headers": [], "leaderEpoch": 0,
                                      "producerId": -1} for o in range(n)], schema=arrow)

    first = Ledger({"T:0": 3, "K1:0": 2}, {}, {"t": "T", "k": "K1"})
    table.append(pa.concat_tables([rows("t", 3), rows("k", 2)]), snapshot_properties=first.summary("p1", []))
    # the topic k re-created, its new incarnation kept beside (a ledger property of before `ids`)
    table = table.refresh()
    table.append(rows("k", 1), snapshot_properties=Ledger({"T:0": 3, "K1:0": 2, "K2:0": 1}, {},
                                                          {"t": "T", "k": "K2"}).summary("p2", []))
    with table.transaction() as tx:
        tx.set_properties({LEDGER: json.dumps({"ends": {"T:0": 3, "K1:0": 2, "K2:0": 1}, "starts": {},
                                               "topics": {"t": "T", "k": "K2"}})})
    # k's files compacted into one (its snapshot names no incarnation its rows were added under): nothing tells the
    # two incarnations' rows apart now (the file of a pass's own append would: its ledger names the id it added)
    from tierproxy.jobs.iceberg.compaction import COMPACTION

    table = table.refresh()
    table.overwrite(pa.concat_tables([rows("k", 2), rows("k", 1)]), overwrite_filter="topic = 'k'",
                    snapshot_properties={**Ledger({"T:0": 3, "K1:0": 2, "K2:0": 1}, {}, {"t": "T", "k": "K2"})
                                         .summary("c1", []), COMPACTION: "c1"})
    table = open_table(catalog, cfg, "kafka.history")  # gains the column
    before = sorted((r["topic"], r["offset"]) for r in table.scan().to_arrow().to_pylist())

    def load() -> Any:
        return open_catalog(cfg).load_table("kafka.history")

    with table.transaction() as tx:  # a pass writing the table (its live lease): the backfill changes nothing
        tx.set_properties({WRITER: Lease.new("a-pass").value()})
    with pytest.raises(CatalogError, match="being written by pass a-pass"):
        backfill(table.refresh(), "kafka.history", cfg.io, 30_000, load)
    with table.transaction() as tx:
        tx.remove_properties(WRITER)
    table = table.refresh()
    assert sorted((r["topic"], r["offset"], r[TOPIC_ID]) for r in table.scan().to_arrow().to_pylist()) == [
        (t, o, None) for t, o in before]

    done = backfill(table, "kafka.history", cfg.io, 30_000, load)
    assert done.files == 1 and done.rows == 3, done
    assert list(done.left) == ["k"] and "K1, K2" in done.left["k"], done.left
    table = table.refresh()
    got = table.scan().to_arrow().to_pylist()
    assert sorted((r["topic"], r["offset"]) for r in got) == before  # the same rows
    assert {(r["topic"], r[TOPIC_ID]) for r in got} == {("t", "T"), ("k", None)}
    assert WRITER not in table.properties
    # the command: once done, nothing left it can fill; exit 1 while rows stay null (`k`), naming them
    from tests.support.cli import run_cli

    proc = run_cli("iceberg", "backfill-topic-ids", "--storage", f"file://{tmp_path}/tier", "--table", "kafka.history",
                   cwd=tmp_path, env={"TIERPROXY_TIER_STATE_DIR": str(tmp_path / "state")})
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert proc.stdout.startswith("backfill of kafka.history: 0 files rewritten") and "left null: k: " in proc.stdout
