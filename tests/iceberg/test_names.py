"""One table, one source (issue 67, item 3): a typed table records the topic it was made for, and a different topic
mapping to it is refused with TableCollision whenever it appears (`a-b` tabled, then `a.b`; `Orders`, then `orders`
on a catalog that compares names case-folded), on a real SQL catalog."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from tierproxy.config.values import TableCollision, typed_table_rules, typed_tables
from tierproxy.jobs.iceberg.catalog import CatalogConfig, catalog_config, open_catalog
from tierproxy.jobs.iceberg.typed_tables import TypedOptions, open_typed


def _string_table(catalog: Any, cfg: CatalogConfig, name: str, topic: str) -> Any:
    """The typed table of `topic` (string values: no registry needed), created or opened."""
    return open_typed(catalog, cfg, name, TypedOptions(None, f"{topic}-value", value_format="string"))


def test_a_topic_mapping_to_a_table_made_for_another_is_refused_whenever_it_appears(tmp_path: Path) -> None:
    """`a-b` tabled as kafka.a_b and then deleted (the table stays); `a.b` created later maps to the same table: it
    was appended to `a-b`'s table (in upsert mode its keys deleted `a-b`'s rows)."""
    cfg = catalog_config(None, f"file://{tmp_path}/tier", str(tmp_path / "state"))
    catalog = open_catalog(cfg)
    made = _string_table(catalog, cfg, "kafka.a_b", "a-b")
    assert made is not None
    assert _string_table(catalog, cfg, "kafka.a_b", "a-b") is not None  # its own topic opens it again
    with pytest.raises(TableCollision, match=r"kafka\.a_b.*'a-b'.*'a\.b'"):
        _string_table(catalog, cfg, "kafka.a_b", "a.b")
    with pytest.raises(TableCollision, match=r"kafka\.a_b_dlq.*'a-b'.*'a_b_dlq'"):  # `a-b`'s dead letters
        _string_table(catalog, cfg, "kafka.a_b_dlq", "a_b_dlq")


def _case_folding_sql_catalog(tmp_path: Path) -> CatalogConfig:
    """pyiceberg's SQL catalog on a database that compares table and namespace names case-insensitively, as the SQL
    catalog does on MySQL (its default collation folds case) and as Glue and Hive do: SQLite with the catalog's
    tables declared `COLLATE NOCASE` before the catalog opens them (it creates only missing tables)."""
    db = tmp_path / "folding.db"
    engine = sa.create_engine(f"sqlite:///{db}")
    with engine.begin() as c:
        c.execute(sa.text(
            "CREATE TABLE iceberg_tables (catalog_name VARCHAR(255) NOT NULL, table_namespace VARCHAR(255) COLLATE "
            "NOCASE NOT NULL, table_name VARCHAR(255) COLLATE NOCASE NOT NULL, metadata_location VARCHAR(1000), "
            "previous_metadata_location VARCHAR(1000), iceberg_type VARCHAR(5), PRIMARY KEY (catalog_name, "
            "table_namespace, table_name))"))
        c.execute(sa.text(
            "CREATE TABLE iceberg_namespace_properties (catalog_name VARCHAR(255) NOT NULL, namespace VARCHAR(255) "
            "COLLATE NOCASE NOT NULL, property_key VARCHAR(255) NOT NULL, property_value VARCHAR(1000) NOT NULL, "
            "PRIMARY KEY (catalog_name, namespace, property_key))"))
    engine.dispose()
    default = catalog_config(None, f"file://{tmp_path}/tier", str(tmp_path / "state"))
    return CatalogConfig(f"sqlite:///{db}", default.warehouse, default.io, embedded=True)


def test_orders_then_orders_on_a_case_folding_catalog_is_refused(tmp_path: Path) -> None:
    """`Orders` tabled as kafka.Orders; `orders` maps to kafka.orders, which a case-folding catalog answers with
    `Orders`' table: `orders` was appended to it."""
    cfg = _case_folding_sql_catalog(tmp_path)
    catalog = open_catalog(cfg)
    assert _string_table(catalog, cfg, "kafka.Orders", "Orders") is not None
    assert catalog.table_exists("kafka.orders"), "the catalog folds names (the test's premise)"
    with pytest.raises(TableCollision, match=r"'Orders'.*'orders'"):
        _string_table(catalog, cfg, "kafka.orders", "orders")
    # asked, the catalog says it folds (a SQLite URI says otherwise): both at once are refused before anything
    from tierproxy.jobs.iceberg.catalog import name_key

    with pytest.raises(TableCollision, match="'Orders' and 'orders'"):
        typed_tables(typed_table_rules(r".*=kafka.{topic}"), ["Orders", "orders"], name_key(cfg, catalog, ["kafka"]))
    exact = catalog_config(None, f"file://{tmp_path}/other", str(tmp_path / "state-other"))
    plain = open_catalog(exact)
    _string_table(plain, exact, "kafka.Orders", "Orders")
    assert name_key(exact, plain, ["kafka"])("kafka.Orders") == "kafka.Orders"  # asked, it compares exactly


def test_topics_whose_tables_the_catalog_names_alike_are_refused_before_anything_is_written() -> None:
    """Both topics at once: refused by the configuration check with the catalog's own name comparison; where the
    catalog compares exactly, `Orders` and `orders` are two tables."""
    from tierproxy.jobs.iceberg.catalog import name_key

    rules = typed_table_rules(r".*=kafka.{topic}")
    with pytest.raises(TableCollision, match=r"'a-b' and 'a\.b'"):
        typed_tables(rules, ["a-b", "a.b"])
    folding, exact = name_key(CatalogConfig("rest:https://catalog.example.com", "s3://w")), name_key(
        CatalogConfig("sqlite:////tmp/catalog.db", "file:///w"))
    with pytest.raises(TableCollision, match="'Orders' and 'orders'"):
        typed_tables(rules, ["Orders", "orders"], folding)
    assert typed_tables(rules, ["Orders", "orders"], exact) == {"Orders": "kafka.Orders", "orders": "kafka.orders"}
    assert re.fullmatch("kafka.orders", folding("kafka.ORDERS"))
