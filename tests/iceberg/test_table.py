"""The tier as an Iceberg table, against a real broker, real PySpark and real catalogs: the table read by DuckDB,
pyiceberg and the DataFrame reader equals what Spark's Kafka source read from the broker under read_committed."""

from __future__ import annotations

import os
import shutil
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from operator import itemgetter
from pathlib import Path
from typing import Any

import pytest

from tests.support.iceberg import duckdb_raw_rows, duckdb_rows, iceberg_cli, pyiceberg_rows, pyiceberg_table
from tests.support.kafka import create_topic, watermarks
from tests.support.rest_catalog import RestCatalogServer
from tests.support.s3 import S3Server
from tests.support.spark import delete_on_broker, kafka_source, read, tier_once
from tests.support.spark_iceberg import spark_iceberg_reads
from tests.support.tiering import produce_everything
from tierproxy.dev.kafkadist import KafkaCluster
from tierproxy.dev.ports import free_port

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


class Tiered:
    """A topic tiered to `storage`, deleted by the broker, and what Spark's Kafka source read before that."""

    def __init__(self, bootstrap: str, topic: str, tmp: Path, expected: list[tuple[Any, ...]],
                 uncommitted: list[tuple[Any, ...]] | None = None) -> None:
        self.bootstrap, self.topic, self.tmp, self.expected = bootstrap, topic, tmp, expected
        self.uncommitted = uncommitted or []
        self.storage, self.metadata = f"file://{tmp}/tier", f"file://{tmp}/meta"

    def args(self, *extra: str) -> list[str]:
        return ["--bootstrap-server", self.bootstrap, "--storage", self.storage, "--metadata", self.metadata,
                "--topics", self.topic, "--master", "local[2]", *extra]

    @property
    def embedded(self) -> tuple[str, str]:
        """The embedded catalog's URI and warehouse (next to a file:// tier)."""
        return f"sqlite:///{self.tmp}/tier/iceberg/catalog.db", f"file://{self.tmp}/tier/iceberg"


@pytest.fixture(scope="module")
def tiered(kafka: KafkaCluster, spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Tiered:
    tmp = tmp_path_factory.mktemp("iceberg")
    topic = f"iceberg-history-{os.getpid()}"
    create_topic(kafka.bootstrap, topic, partitions=2, config={"segment.ms": "500"})
    produce_everything(kafka.bootstrap, topic)
    expected = kafka_source(spark, kafka.bootstrap, topic, includeHeaders="true",
                            **{"kafka.isolation.level": "read_committed"})
    uncommitted = kafka_source(spark, kafka.bootstrap, topic, includeHeaders="true",
                               **{"kafka.isolation.level": "read_uncommitted"})
    assert len(uncommitted) > len(expected)  # aborted records are there to keep or drop
    t = Tiered(kafka.bootstrap, topic, tmp, expected, uncommitted)
    tier_once(kafka.bootstrap, topic, t.storage, t.metadata, tmp)
    delete_on_broker(kafka.bootstrap, topic, 2)
    return t


def test_the_table_equals_sparks_kafka_source_read_committed(tiered: Tiered, spark: Any) -> None:
    t = tiered
    assert all(watermarks(t.bootstrap, t.topic, i)[0] > 0 for i in range(2))  # the broker lost offset 0
    out = iceberg_cli(t.tmp, *t.args("--once"))
    assert "iceberg pass" in out.stdout
    uri, wh = t.embedded
    table = pyiceberg_table(uri, wh, "kafka.history")
    got = pyiceberg_rows(table)
    assert len(t.expected) > 1500
    assert [r for r in got if r[1] is not None and r[1].startswith(b"abort-")] == []
    assert got == t.expected
    # DuckDB from the metadata file the CLI names, as the README shows
    located = iceberg_cli(t.tmp, "metadata-location", "--bootstrap-server", t.bootstrap, "--storage", t.storage)
    assert located.stdout.strip() == table.metadata_location
    assert duckdb_rows(located.stdout.strip()) == t.expected
    tier_df = read(spark, "tierproxy", {"kafka.bootstrap.servers": t.bootstrap, "storage": t.storage,
                                        "metadata": t.metadata, "subscribe": t.topic, "includeHeaders": "true",
                                        "kafka.isolation.level": "read_committed"})
    assert tier_df == t.expected
    # --isolation read_uncommitted keeps aborted records (control batches still never become rows)
    raw = iceberg_cli(t.tmp, *t.args("--once", "--isolation", "read_uncommitted", "--table", "kafka.raw"))
    assert "iceberg pass" in raw.stdout
    assert pyiceberg_rows(pyiceberg_table(uri, wh, "kafka.raw")) == t.uncommitted
    # a second pass adds nothing: the ledger says every tiered segment is in
    before = table.current_snapshot().snapshot_id
    again = iceberg_cli(t.tmp, *t.args("--once"))
    assert " 0 files, 0 rows added" in again.stdout, again.stdout
    assert pyiceberg_table(uri, wh, "kafka.history").current_snapshot().snapshot_id == before


class _Refusing(BaseHTTPRequestHandler):
    # a REST catalog that refuses tierproxy's credentials: a stand-in kept for that alone, since Apache Iceberg's
    # REST catalog server (the `rest_catalog` the other tests write through) checks no credentials to refuse
    def do_GET(self) -> None:
        body = b'{"error": {"message": "Not authorized", "type": "NotAuthorizedException", "code": 401}}'
        self.send_response(401)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_bad_catalogs_and_tables_are_refused_with_their_name_and_the_table_unchanged(tiered: Tiered,
                                                                                      tmp_path: Path) -> None:
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField

    t = tiered
    closed = free_port()
    out = iceberg_cli(t.tmp, *t.args("--once", "--catalog", f"rest:http://127.0.0.1:{closed}"), check=False)
    assert out.returncode == 7 and f"catalog rest:http://127.0.0.1:{closed}" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr

    server = HTTPServer(("127.0.0.1", 0), _Refusing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        uri = f"rest:http://127.0.0.1:{server.server_port}"
        out = iceberg_cli(t.tmp, *t.args("--once", "--catalog", uri), check=False)
        assert out.returncode == 7 and uri in out.stderr and "Not authorized" in out.stderr, out.stderr
    finally:
        server.shutdown()
        server.server_close()

    other = f"sqlite:///{tmp_path}/other.db"
    out = iceberg_cli(t.tmp, *t.args("--once", "--catalog", other, "--table", "nowhere.history"), check=False)
    assert out.returncode == 7 and "namespace 'nowhere' does not exist" in out.stderr, out.stderr

    catalog = SqlCatalog("tierproxy", uri=other, warehouse=f"file://{tmp_path}/wh")
    catalog.create_namespace("kafka")
    foreign = catalog.create_table("kafka.orders", schema=Schema(NestedField(1, "id", LongType(), required=True)))
    out = iceberg_cli(t.tmp, *t.args("--once", "--catalog", other, "--table", "kafka.orders"), check=False)
    assert out.returncode == 7 and "table kafka.orders exists with another schema (id long)" in out.stderr
    assert catalog.load_table("kafka.orders").metadata_location == foreign.metadata_location


def test_a_segment_failing_its_crc_stops_the_pass_naming_it_and_nothing_is_committed(tiered: Tiered,
                                                                                     tmp_path: Path) -> None:
    t = tiered
    shutil.copytree(t.tmp / "tier", tmp_path / "tier", ignore=shutil.ignore_patterns("iceberg"))
    shutil.copytree(t.tmp / "meta", tmp_path / "meta")
    logs = sorted((tmp_path / "tier").rglob("*.log"), key=lambda p: p.stat().st_size)
    bad = logs[-1]
    data = bytearray(bad.read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit inside a batch
    bad.write_bytes(bytes(data))
    copy = Tiered(t.bootstrap, t.topic, tmp_path, t.expected)
    out = iceberg_cli(tmp_path, *copy.args("--once"), check=False)
    segment_id = bad.stem.split("-", 1)[1]
    assert out.returncode == 8 and "fails its CRC" in out.stderr and segment_id in out.stderr, out.stderr[-3000:]
    assert "Traceback" not in out.stderr
    uri, wh = copy.embedded
    table = pyiceberg_table(uri, wh, "kafka.history")  # nothing committed but the pass's lease (an empty snapshot)
    assert [f for f in table.scan().plan_files()] == [] and "tierproxy.writer" not in table.properties


def test_the_same_tables_through_apache_icebergs_rest_catalog_server(tiered: Tiered,
                                                                     rest_catalog: RestCatalogServer) -> None:
    """The raw tables (read_committed and read_uncommitted) written through a REST catalog server a user runs hold
    the same rows as the embedded SQL catalog's for the same tier, read through the catalog by pyiceberg, DuckDB and
    Spark with Iceberg's runtime."""
    t, rest = tiered, f"rest:{rest_catalog.uri}"
    refused = iceberg_cli(t.tmp, *t.args("--once", "--catalog", rest, "--table", "raw.history"), check=False)
    assert refused.returncode == 7 and "namespace 'raw' does not exist" in refused.stderr  # not ours to create
    rest_catalog.namespace("raw")  # as the catalog's owner would
    uri, wh = t.embedded
    # each: the table's name in both catalogs, its isolation, the rows Spark's Kafka source read from the broker
    tables = [("history", "read_committed", t.expected), ("raw", "read_uncommitted", t.uncommitted)]
    sql: dict[str, Any] = {}
    for name, isolation, _ in tables:
        iceberg_cli(t.tmp, *t.args("--once", "--isolation", isolation, "--table", f"kafka.{name}"))  # as above
        out = iceberg_cli(t.tmp, *t.args("--once", "--isolation", isolation, "--catalog", rest, "--table",
                                         f"raw.{name}"))
        assert "iceberg pass" in out.stdout
        sql[name] = pyiceberg_table(uri, wh, f"kafka.{name}")
    catalog = rest_catalog.catalog()
    assert catalog.load_table("raw.history").location().startswith(rest_catalog.warehouse)  # the server placed it
    for name, _, want in tables:
        assert pyiceberg_rows(catalog.load_table(f"raw.{name}")) == pyiceberg_rows(sql[name]) == want, name
        duck = duckdb_raw_rows(rest_catalog.duckdb(), f"rest.raw.{name}")
        assert duck == duckdb_rows(sql[name].metadata_location) == want, name
    columns = ["partition", "offset", "hex(key) AS key", "hex(value) AS value", "topic", "unix_micros(timestamp) AS ts",
               "timestampType", "to_json(headers) AS headers"]
    reads = spark_iceberg_reads(*((sql[name].metadata_location, columns) for name, _, _ in tables),
                                *(rest_catalog.spark_read(f"raw.{name}", columns) for name, _, _ in tables))
    for i, (name, _, want) in enumerate(tables):
        via_rest, via_sql = (sorted(rows, key=itemgetter("partition", "offset")) for rows in (reads[2 + i], reads[i]))
        assert via_rest == via_sql, name
        assert [(r["partition"], r["offset"], r["value"]) for r in via_rest] == \
            [(w[3], w[4], None if w[1] is None else w[1].hex().upper()) for w in want], name
    # asked, Iceberg's REST server (a JDBC catalog on SQLite) compares names exactly: Orders and orders are two
    from tierproxy.jobs.iceberg.catalog import CatalogConfig, name_key

    assert name_key(CatalogConfig(rest, rest_catalog.warehouse), rest_catalog.catalog(),
                    ["raw"])("raw.Orders") == "raw.Orders"


def test_an_s3_tier_makes_the_same_table_on_s3(tiered: Tiered, s3: S3Server, tmp_path: Path) -> None:
    """The same tiered segments on SeaweedFS (the file tier's objects uploaded under the same keys): the table's
    warehouse is then on S3 too, written by the executors with the tier's endpoint and credentials."""
    import asyncio

    from tierproxy.tier.storage import S3Store

    t = tiered
    s3.create_bucket("tier")

    async def upload() -> None:
        store = S3Store("tier", endpoint=s3.endpoint, region=s3.region)
        try:
            for f in (t.tmp / "tier").rglob("*"):
                if f.is_file() and "iceberg" not in f.parts:
                    await store.put(f"history/{f.relative_to(t.tmp / 'tier')}", f.read_bytes())
        finally:
            await store.close()

    asyncio.run(upload())
    on_s3 = Tiered(t.bootstrap, t.topic, tmp_path, t.expected)
    on_s3.storage, on_s3.metadata = f"s3://tier/history?endpoint={s3.endpoint}&region={s3.region}", t.metadata
    out = iceberg_cli(tmp_path, *on_s3.args("--once"))
    assert "iceberg pass" in out.stdout
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("tierproxy", uri=f"sqlite:///{tmp_path}/state/catalog.db", warehouse="s3://tier/history/iceberg",
                         **{"s3.endpoint": s3.endpoint, "s3.region": s3.region, "s3.access-key-id": s3.access_key,
                            "s3.secret-access-key": s3.secret_key})
    table = catalog.load_table("kafka.history")
    assert table.location().startswith("s3://tier/history/iceberg/")
    assert pyiceberg_rows(table) == t.expected
    assert duckdb_rows(table.metadata_location, s3=s3) == t.expected


def test_the_ledger_survives_another_writer_and_snapshot_expiry(tiered: Tiered) -> None:
    """Another writer appends a row of its own, then every snapshot but the current is expired: the ledger is a
    table property set in each pass's commit, so the next pass adds nothing (before: the ledger lived only in the
    summaries of expired snapshots, and the pass appended the whole tier again)."""
    import pyarrow as pa

    t = tiered
    uri, wh = t.embedded
    iceberg_cli(t.tmp, *t.args("--once", "--table", "kafka.shared"))
    table = pyiceberg_table(uri, wh, "kafka.shared")
    assert pyiceberg_rows(table) == t.expected
    one = table.scan(limit=1).to_arrow()
    column = one.schema.get_field_index("topic")
    table.append(one.set_column(column, one.schema.field(column), pa.array(["manual"], one.schema.field(column).type)))
    table = table.refresh()
    current = table.current_snapshot().snapshot_id
    table.maintenance.expire_snapshots().by_ids([s.snapshot_id for s in table.metadata.snapshots
                                                 if s.snapshot_id != current]).commit()
    assert [s.snapshot_id for s in table.refresh().metadata.snapshots] == [current]

    again = iceberg_cli(t.tmp, *t.args("--once", "--table", "kafka.shared"))
    assert " 0 files, 0 rows added" in again.stdout, again.stdout
    located = iceberg_cli(t.tmp, "metadata-location", "--bootstrap-server", t.bootstrap, "--storage", t.storage,
                          "--table", "kafka.shared").stdout.strip()
    rows = duckdb_rows(located)
    assert len(rows) == len(t.expected) + 1  # DuckDB's count: Spark's Kafka source's, and the other writer's row
    assert [r for r in rows if r[2] != "manual"] == t.expected


def test_a_table_another_pass_holds_is_left_unchanged(tiered: Tiered) -> None:
    """The single-writer lease: while another pass holds the table (its lease younger than
    iceberg.orphan.min.age.ms), a pass refuses with one line (exit 7) and changes nothing; a lease that old is a
    dead pass's, and the next pass goes on."""
    import time

    t = tiered
    uri, wh = t.embedded
    iceberg_cli(t.tmp, *t.args("--once", "--table", "kafka.leased"))
    table = pyiceberg_table(uri, wh, "kafka.leased")
    before = (table.current_snapshot().snapshot_id, pyiceberg_rows(table))
    hour = {"TIERPROXY_ICEBERG_ORPHAN_MIN_AGE_MS": "3600000"}
    for started, refused in ((int(time.time() * 1000), True), (int(time.time() * 1000) - 3_700_000, False)):
        with table.transaction() as tx:
            tx.set_properties({"tierproxy.writer": f"otherpass {started}"})
        run = iceberg_cli(t.tmp, *t.args("--once", "--table", "kafka.leased"), env=hour, check=False)
        if refused:
            assert run.returncode == 7 and "being written by pass otherpass" in run.stderr.strip().splitlines()[-1]
        else:
            assert run.returncode == 0, run.stderr[-2000:]
        table = pyiceberg_table(uri, wh, "kafka.leased")
        assert (table.current_snapshot().snapshot_id, pyiceberg_rows(table)) == before
