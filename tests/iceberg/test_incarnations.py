"""Incarnations kept apart (issue 67, item 2), on their own: a table made before the topic id column gains it by
schema evolution (its rows and files as they were, null there), and the ledger records every incarnation held.
End to end (a topic re-created under `--retention keep`): tests/iceberg/test_lifecycle.py."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
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
