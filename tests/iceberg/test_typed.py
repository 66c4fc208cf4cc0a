"""Typed tables end to end: Avro records produced by confluent-kafka's serializers against a real schema registry
(Apicurio), through three compatible versions and one incompatible, with records of an unknown schema id, garbage and
an aborted transaction; tiered, deleted by the broker, then `tierproxy iceberg` builds the typed table and its
dead-letter table from the tier alone (a backfill: the history was tiered before the table existed). DuckDB and
pyiceberg read typed columns equal, row by row, to what confluent-kafka's AvroDeserializer decodes from the broker
under read_committed."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import time
from operator import itemgetter
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from tests.support.iceberg import duckdb_connect, iceberg_cli, killed_at, pyiceberg_table
from tests.support.kafka import create_topic, watermarks
from tests.support.registry import Registry
from tests.support.rest_catalog import RestCatalogServer
from tests.support.spark import delete_on_broker, tier_once
from tests.support.spark_iceberg import spark_iceberg_reads, spark_iceberg_rows
from tierproxy.dev.kafkadist import KafkaCluster
from tierproxy.dev.ports import free_port

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.registry]


def _order(*fields: dict[str, Any]) -> str:
    return json.dumps({"type": "record", "name": "Order", "namespace": "shop", "fields": list(fields)})


ID, ITEM = {"name": "id", "type": "long"}, {"name": "item", "type": "string"}
V1 = _order(ID, ITEM, {"name": "qty", "type": "int"},
            {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}})
V2 = _order(ID, ITEM, {"name": "qty", "type": "int"},
            {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
            {"name": "note", "type": ["null", "string"], "default": None})  # an added optional field
V3 = _order(ID, ITEM, {"name": "qty", "type": "long"},  # widened int → long
            {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
            {"name": "note", "type": ["null", "string"], "default": None})
V4 = _order(ID, {"name": "title", "type": "string"}, {"name": "qty", "type": "long"},  # item renamed: incompatible
            {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}})
VALUE_COLUMNS = ["id", "item", "qty", "at", "note"]


class Typed:
    def __init__(self, kafka: KafkaCluster, registry: Registry, tmp: Path, topic: str) -> None:
        self.kafka, self.registry, self.tmp, self.topic = kafka, registry, tmp, topic
        self.storage, self.metadata = f"file://{tmp}/tier", f"file://{tmp}/meta"
        self.table = "kafka." + topic.replace("-", "_")
        self.expected: dict[tuple[int, int], dict[str, Any] | None] = {}  # None: AvroDeserializer refused it
        self.versions: dict[tuple[int, int], str] = {}  # which producer wrote the record

    def env(self, **extra: str) -> dict[str, str]:
        return {"TIERPROXY_ICEBERG_TABLES": f"{self.topic}=kafka.{{topic}}",
                "TIERPROXY_ICEBERG_SCHEMA_REGISTRY_URL": self.registry.url, **extra}

    def args(self, *extra: str) -> list[str]:
        return ["--bootstrap-server", self.kafka.bootstrap, "--storage", self.storage, "--metadata", self.metadata,
                "--master", "local[2]", *extra]


def _produce(t: Typed) -> None:
    ctx = SerializationContext(t.topic, MessageField.VALUE)
    with SchemaRegistryClient({"url": t.registry.url, "timeout": 30}) as client:
        p = Producer({"bootstrap.servers": t.kafka.bootstrap, "linger.ms": 5})
        for n, (name, schema) in enumerate((("v1", V1), ("v2", V2), ("v3", V3), ("v4", V4))):
            ser = AvroSerializer(client, schema)
            for i in range(120):
                rec: dict[str, Any] = {"id": n * 1000 + i, "qty": i, "at": 1_700_000_000_000 + i}
                rec["title" if name == "v4" else "item"] = f"{name}-item-{i}"
                if name in ("v2", "v3"):
                    rec["note"] = None if i % 3 else f"note {i}"
                p.produce(t.topic, ser(rec, ctx), f"k{i}".encode(), partition=i % 2)
            p.flush(30)
            if name == "v1":  # an aborted transaction of valid records: rows of neither table
                tx = Producer({"bootstrap.servers": t.kafka.bootstrap, "transactional.id": f"tx-{t.topic}"})
                tx.init_transactions(30)
                tx.begin_transaction()
                for i in range(20):
                    tx.produce(t.topic, ser({"id": -i, "item": "aborted", "qty": 0, "at": 0}, ctx), partition=i % 2)
                tx.abort_transaction(30)
        for i in range(15):  # a schema id the registry never gave, and bytes that are no wire format at all
            p.produce(t.topic, b"\0" + struct.pack(">I", 987654) + b"\x02\x04ab", partition=i % 2)
            p.produce(t.topic, b"plain text, no schema", partition=i % 2)
        p.produce(t.topic, b"after-the-transaction", partition=0)
        p.produce(t.topic, b"after-the-transaction", partition=1)
        p.flush(30)
        _expected(t, client)


def _expected(t: Typed, client: SchemaRegistryClient) -> None:
    """What the broker holds under read_committed, decoded as applications decode it."""
    read = AvroDeserializer(client)
    ctx = SerializationContext(t.topic, MessageField.VALUE)
    ends = {p: watermarks(t.kafka.bootstrap, t.topic, p)[1] for p in (0, 1)}
    c = Consumer({"bootstrap.servers": t.kafka.bootstrap, "group.id": f"expect-{t.topic}", "enable.auto.commit": False,
                  "auto.offset.reset": "earliest", "isolation.level": "read_committed"})
    c.subscribe([t.topic])
    done: set[int] = set()
    try:
        for _ in range(600):
            if len(done) == 2:
                break
            m = c.poll(0.5)
            if m is None or m.error():
                continue
            try:
                t.expected[(m.partition(), m.offset())] = read(m.value(), ctx)
            except Exception:
                t.expected[(m.partition(), m.offset())] = None
            if m.offset() >= ends[m.partition()] - 1:
                done.add(m.partition())
    finally:
        c.close()
    assert len(t.expected) == 4 * 120 + 30 + 2, len(t.expected)


@pytest.fixture(scope="module")
def typed(kafka: KafkaCluster, schema_registry: Registry, tmp_path_factory: pytest.TempPathFactory) -> Typed:
    tmp = tmp_path_factory.mktemp("typed")
    t = Typed(kafka, schema_registry, tmp, f"typed-orders-{os.getpid()}")
    create_topic(kafka.bootstrap, t.topic, partitions=2, config={"segment.ms": "500"})
    _produce(t)
    tier_once(kafka.bootstrap, t.topic, t.storage, t.metadata, tmp)
    delete_on_broker(kafka.bootstrap, t.topic, 2)
    return t


def _duckdb(metadata: str, columns: list[str]) -> list[dict[str, Any]]:
    con = duckdb_connect()
    cur = con.execute(f"SELECT {', '.join(columns)} FROM iceberg_scan('{metadata}')")
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


def test_the_typed_table_equals_the_avro_deserializer_and_every_other_record_is_a_dead_letter(typed: Typed) -> None:
    """Slow (~60-90 s): the pass decodes every record of four schema versions on Spark, and the
    table is read three ways (pyiceberg, DuckDB, Spark) against the AvroDeserializer."""
    t = typed
    assert all(watermarks(t.kafka.bootstrap, t.topic, p)[0] > 0 for p in (0, 1))  # only the tier has the start
    out = iceberg_cli(t.tmp, *t.args("--once"), env=t.env())
    assert "dead letters" in out.stdout, out.stdout
    uri, wh = f"sqlite:///{t.tmp}/tier/iceberg/catalog.db", f"file://{t.tmp}/tier/iceberg"
    table = pyiceberg_table(uri, wh, t.table)
    dlq = pyiceberg_table(uri, wh, f"{t.table}_dlq")
    columns = {f.name: (str(f.field_type), f.required) for f in table.schema().fields}
    assert columns["qty"] == ("long", True) and columns["note"] == ("string", False)  # widened, added optional
    assert "title" not in columns  # the incompatible version changed nothing
    rows = {(r["_kafka_partition"], r["_kafka_offset"]): r for r in table.scan().to_arrow().to_pylist()}
    dead = {(r["partition"], r["offset"]): r for r in dlq.scan().to_arrow().to_pylist()}
    assert len(rows) + len(dead) == len(t.expected)  # every committed record, once, in one table or the other
    assert not set(rows) & set(dead)
    decoded = {k: v for k, v in t.expected.items() if v is not None and "title" not in v}
    assert set(rows) == set(decoded)
    for key, want in decoded.items():
        got = {c: rows[key][c] for c in VALUE_COLUMNS}
        assert got == {c: want.get(c) for c in VALUE_COLUMNS}, key
    reasons = {k: r["error"] for k, r in dead.items()}
    v4 = [k for k, v in t.expected.items() if v is not None and "title" in v]
    assert len(v4) == 120 and all("incompatible change: required column item" in reasons[k] for k in v4)
    assert sum("987654 is not in the schema registry" in e for e in reasons.values()) == 15
    assert sum("magic byte" in e for e in reasons.values()) == 15 + 2
    assert all(v is None for k, v in t.expected.items() if k in dead and k not in v4)
    # DuckDB from the metadata file, as a user reads it: the same typed rows
    meta = iceberg_cli(t.tmp, *t.args("metadata-location", "--table", t.table), env=t.env()).stdout.strip()
    seen = _duckdb(meta, ['"_kafka_partition"', '"_kafka_offset"', '"id"', '"item"', '"qty"', '"note"',
                          'epoch_ms("at") AS at_ms'])
    assert sorted((r["_kafka_partition"], r["_kafka_offset"], r["id"], r["item"], r["qty"], r["note"], r["at_ms"])
                  for r in seen) == sorted((k[0], k[1], v["id"], v["item"], v["qty"], v.get("note"),
                                            int(v["at"].timestamp() * 1000)) for k, v in decoded.items())
    # Spark with Iceberg's runtime, from the same metadata file: the same typed rows and dead letters
    dlq_meta = iceberg_cli(t.tmp, *t.args("metadata-location", "--table", f"{t.table}_dlq"),
                           env=t.env()).stdout.strip()
    spark, spark_dlq = spark_iceberg_reads(
        (meta, ["_kafka_partition", "_kafka_offset", "id", "item", "qty", "note", "unix_millis(at) AS at_ms"]),
        (dlq_meta, ["partition", "offset", "error"]))
    assert sorted((r["_kafka_partition"], r["_kafka_offset"], r["id"], r["item"], r["qty"], r["note"], r["at_ms"])
                  for r in spark) == sorted((k[0], k[1], v["id"], v["item"], v["qty"], v.get("note"),
                                             int(v["at"].timestamp() * 1000)) for k, v in decoded.items())
    assert sorted((r["partition"], r["offset"], r["error"]) for r in spark_dlq) == \
        sorted((k[0], k[1], e) for k, e in reasons.items())
    # a rerun adds nothing: exactly once
    again = iceberg_cli(t.tmp, *t.args("--once"), env=t.env())
    assert " 0 rows added" in again.stdout and " 0 dead letters" in again.stdout, again.stdout
    assert len(table.refresh().scan().to_arrow()) == len(rows)


def test_the_admin_api_and_metrics_count_typed_rows_and_dead_letters(typed: Typed) -> None:
    import httpx

    from tests.fleet.conftest import replica
    from tests.support.waiting import wait_until

    t = typed
    iceberg_cli(t.tmp, *t.args("--once"), env=t.env())  # the table as the other test makes it (in any order)
    admin = f"127.0.0.1:{free_port()}"
    proxy = replica(t.kafka.bootstrap, t.tmp, t.storage, t.metadata, TIERPROXY_ICEBERG_CATALOG="embedded",
                    TIERPROXY_ADMIN_LISTEN=admin, TIERPROXY_ICEBERG_TABLES=t.env()["TIERPROXY_ICEBERG_TABLES"])
    try:
        url = f"http://{admin}"
        st = wait_until(lambda: (r := httpx.get(f"{url}/v1/iceberg", timeout=30)).status_code == 200 and
                        r.json().get("typed") and r.json(), timeout=60, interval=0.5, what="the typed tables' status")
        [mine] = [x for x in st["typed"] if x["topic"] == t.topic]
        assert mine["table"] == t.table and mine["exists"] and mine["rows"] == 360 and mine["dead_letters"] == 152
        assert mine["lag_offsets"] == 0 and {p["partition"] for p in mine["partitions"]} == {0, 1}, mine
        metrics = httpx.get(f"{url}/metrics", timeout=30).text
        assert f'tierproxy_iceberg_typed_rows{{table="{t.table}"}} 360.0' in metrics
        assert f'tierproxy_iceberg_dead_letters{{table="{t.table}"}} 152.0' in metrics
        assert f'tierproxy_iceberg_typed_lag_offsets{{table="{t.table}"}} 0.0' in metrics
        out = subprocess.run([sys.executable, "-m", "tierproxy.cli", "admin", "--url", url, "iceberg"],
                             capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "200"})
        assert out.returncode == 0 and t.table in out.stdout and "152" in out.stdout, out.stdout + out.stderr
    finally:
        proxy.stop()


def test_the_typed_tables_through_apache_icebergs_rest_catalog_server_equal_the_sql_catalogs(
        typed: Typed, rest_catalog: RestCatalogServer) -> None:
    """The typed table and its dead letters written through a REST catalog server a user runs hold the same rows as
    the embedded SQL catalog's for the same tier, read through the catalog by pyiceberg, DuckDB and Spark with
    Iceberg's runtime."""
    t = typed
    iceberg_cli(t.tmp, *t.args("--once"), env=t.env())  # the SQL catalog's tables, as the first test makes them
    ns = rest_catalog.namespace("typed")
    env = {**t.env(), "TIERPROXY_ICEBERG_TABLES": f"{t.topic}={ns}.{{topic}}"}
    out = iceberg_cli(t.tmp, *t.args("--once", "--catalog", f"rest:{rest_catalog.uri}"), env=env)
    assert " 360 rows added" in out.stdout and " 152 dead letters" in out.stdout, out.stdout
    uri, wh = f"sqlite:///{t.tmp}/tier/iceberg/catalog.db", f"file://{t.tmp}/tier/iceberg"
    name = t.table.split(".", 1)[1]
    catalog = rest_catalog.catalog()
    keys = {"": ("_kafka_partition", "_kafka_offset"), "_dlq": ("partition", "offset")}  # the table, its dead letters
    for suffix, (part, off) in keys.items():
        sql, rest = pyiceberg_table(uri, wh, f"{t.table}{suffix}"), catalog.load_table(f"{ns}.{name}{suffix}")
        assert rest.schema() == sql.schema() and rest.spec() == sql.spec(), suffix
        want = sorted(sql.scan().to_arrow().to_pylist(), key=lambda r: (r[part], r[off]))
        assert len(want) == {"": 360, "_dlq": 152}[suffix]
        assert sorted(rest.scan().to_arrow().to_pylist(), key=lambda r: (r[part], r[off])) == want, suffix
        # DuckDB: every column compared inside DuckDB (its timestamptz would need pytz in Python), both ways
        a, b = f"rest.{ns}.{name}{suffix}", f"iceberg_scan('{sql.metadata_location}')"
        con = rest_catalog.duckdb()
        differ = con.execute(f"SELECT count(*) FROM ((SELECT * FROM {a} EXCEPT ALL SELECT * FROM {b}) UNION ALL "
                             f"(SELECT * FROM {b} EXCEPT ALL SELECT * FROM {a}))").fetchone()
        assert differ == (0,) and con.execute(f"SELECT count(*) FROM {a}").fetchone() == (len(want),), suffix
    columns = ["_kafka_partition", "_kafka_offset", "id", "item", "qty", "note", "unix_millis(at) AS at_ms"]
    sql_meta = pyiceberg_table(uri, wh, t.table).metadata_location
    via_sql, via_rest = spark_iceberg_reads((sql_meta, columns), rest_catalog.spark_read(f"{ns}.{name}", columns))
    at = itemgetter("_kafka_partition", "_kafka_offset")
    assert sorted(via_rest, key=at) == sorted(via_sql, key=at) and len(via_rest) == 360


def test_killed_between_the_two_commits_the_next_pass_completes_it_nothing_twice(typed: Typed) -> None:
    t = typed
    env = {**t.env(), "TIERPROXY_ICEBERG_TABLES": f"{t.topic}=killed.{{topic}}"}
    _killed_at(t, "between", env)  # the dead letters committed, the typed rows not
    uri, wh = f"sqlite:///{t.tmp}/tier/iceberg/catalog.db", f"file://{t.tmp}/tier/iceberg"
    name = "killed." + t.topic.replace("-", "_")
    dead_before = len(pyiceberg_table(uri, wh, f"{name}_dlq").scan().to_arrow())
    assert dead_before == 152 and len(pyiceberg_table(uri, wh, name).scan().to_arrow()) == 0  # half a pass
    out = iceberg_cli(t.tmp, *t.args("--once"), env=env)
    assert " 0 dead letters" in out.stdout, out.stdout  # the dead-letter table had its segments already
    rows = pyiceberg_table(uri, wh, name).scan().to_arrow()
    dead = pyiceberg_table(uri, wh, f"{name}_dlq").scan().to_arrow()
    assert len(dead) == dead_before and len(rows) + len(dead) == len(t.expected)
    offsets = list(zip(rows.column("_kafka_partition").to_pylist(), rows.column("_kafka_offset").to_pylist(),
                       strict=True))
    assert len(set(offsets)) == len(offsets) == 360


def test_an_unreachable_registry_fails_the_pass_with_one_line_and_commits_nothing(typed: Typed) -> None:
    t = typed
    dead_url = f"http://127.0.0.1:{free_port()}/apis/ccompat/v7"
    env = {**t.env(TIERPROXY_ICEBERG_SCHEMA_REGISTRY_URL=dead_url),
           "TIERPROXY_ICEBERG_TABLES": f"{t.topic}=other.{{topic}}"}
    proc = iceberg_cli(t.tmp, *t.args("--once"), env=env, check=False)
    assert proc.returncode == 7, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("tierproxy:")]
    assert len(lines) == 1 and "schema registry" in lines[0] and "unreachable" in lines[0], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("check", uri=f"sqlite:///{t.tmp}/tier/iceberg/catalog.db",
                         warehouse=f"file://{t.tmp}/tier/iceberg")
    assert not catalog.table_exists("other." + t.topic.replace("-", "_"))


def test_typed_tables_without_a_registry_url_fail_at_start_naming_the_key(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "tierproxy.cli", "iceberg", "--once", "--bootstrap-server",
                           "127.0.0.1:9", "--storage", f"file://{tmp_path}/tier"], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path, env={**os.environ, "TIERPROXY_ICEBERG_TABLES": "x=kafka.{topic}",
                                                         "TIERPROXY_TIER_STATE_DIR": str(tmp_path / "state")})
    assert proc.returncode == 2 and "iceberg.schema.registry.url" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


PAYMENT_V1 = {"type": "object", "title": "Payment", "properties": {
    "id": {"type": "integer"}, "amount": {"type": "number"}, "at": {"type": "string", "format": "date-time"},
    "tags": {"type": "array", "items": {"type": "string"}}}, "required": ["id", "amount", "at"]}
PAYMENT_V2 = {**PAYMENT_V1, "properties": {**PAYMENT_V1["properties"], "channel": {"type": "string"}}}  # added


def test_json_schema_values_become_columns_through_a_version_change(kafka: KafkaCluster, schema_registry: Registry,
                                                                     tmp_path: Path) -> None:
    t = Typed(kafka, schema_registry, tmp_path, f"typed-payments-{os.getpid()}")
    create_topic(kafka.bootstrap, t.topic, partitions=1, config={"segment.ms": "500"})
    ctx = SerializationContext(t.topic, MessageField.VALUE)
    sent: dict[int, bytes] = {}
    with SchemaRegistryClient({"url": schema_registry.url, "timeout": 30}) as client:
        p = Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 5})
        for n, schema in enumerate((PAYMENT_V1, PAYMENT_V2)):
            ser = JSONSerializer(json.dumps(schema), client)
            for i in range(60):
                doc: dict[str, Any] = {"id": n * 100 + i, "amount": i * 1.5,
                                       "at": f"2024-05-01T12:{i % 60:02d}:00+00:00"}
                if i % 2:
                    doc["tags"] = [f"t{i}"]
                if n == 1 and i % 3 == 0:
                    doc["channel"] = "web"
                value = ser(doc, ctx)
                assert value is not None
                sent[len(sent)] = value
                p.produce(t.topic, value)
        header = sent[0][:5]
        for i in range(5):  # the right schema id, a document that does not match it
            p.produce(t.topic, header + json.dumps({"id": f"no-{i}", "amount": 1, "at": "x"}).encode())
        p.flush(30)
        read = JSONDeserializer(None, schema_registry_client=client)
        expected = {o: read(v, ctx) for o, v in sent.items()}
    tier_once(kafka.bootstrap, t.topic, t.storage, t.metadata, tmp_path)
    out = iceberg_cli(tmp_path, *t.args("--once"), env=t.env())
    assert " 5 dead letters" in out.stdout, out.stdout
    uri, wh = f"sqlite:///{tmp_path}/tier/iceberg/catalog.db", f"file://{tmp_path}/tier/iceberg"
    table = pyiceberg_table(uri, wh, t.table)
    columns = {f.name: (str(f.field_type), f.required) for f in table.schema().fields}
    assert {c: columns[c] for c in ("id", "amount", "at", "channel")} == {
        "id": ("long", True), "amount": ("double", True), "at": ("timestamptz", True), "channel": ("string", False)}
    rows = {r["_kafka_offset"]: r for r in table.scan().to_arrow().to_pylist()}
    assert set(rows) == set(expected)
    for offset, want in expected.items():
        got = rows[offset]
        assert (got["id"], got["amount"], got["at"].isoformat(), got["tags"] or None, got["channel"]) == (
            want["id"], want["amount"], want["at"], want.get("tags"), want.get("channel")), offset
    dead = pyiceberg_table(uri, wh, f"{t.table}_dlq").scan().to_arrow().to_pylist()
    assert [r["offset"] for r in dead] == list(range(120, 125))
    assert all('id is "no-' in r["error"] for r in dead), dead[0]["error"]
    meta = iceberg_cli(tmp_path, *t.args("metadata-location", "--table", t.table), env=t.env()).stdout.strip()
    spark = spark_iceberg_rows(meta, ["_kafka_offset", "id", "amount", "channel", "unix_micros(at) AS at_us"])
    assert sorted((r["_kafka_offset"], r["id"], r["amount"], r["channel"], r["at_us"]) for r in spark) == sorted(
        (o, w["id"], w["amount"], w.get("channel"), int(rows[o]["at"].timestamp() * 1_000_000))
        for o, w in expected.items())


def test_a_purge_removes_rows_below_it_from_both_tables_and_nothing_above(kafka: KafkaCluster,
                                                                         schema_registry: Registry,
                                                                         tmp_path: Path) -> None:
    from tests.fleet.conftest import replica
    from tests.support.kafka import delete_records
    from tests.support.tiering import settings
    from tests.support.tiering import tier_once as tier_in_process

    t = Typed(kafka, schema_registry, tmp_path, f"typed-purged-{os.getpid()}")
    create_topic(kafka.bootstrap, t.topic, partitions=1)
    ctx = SerializationContext(t.topic, MessageField.VALUE)
    with SchemaRegistryClient({"url": schema_registry.url, "timeout": 30}) as client:
        ser = AvroSerializer(client, V1)
        p = Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 5})
        for i in range(600):  # every tenth a dead letter
            value = b"not avro" if i % 10 == 9 else ser({"id": i, "item": f"i{i}", "qty": i, "at": i}, ctx)
            p.produce(t.topic, value, partition=0)
        p.flush(30)
    s = settings(kafka.bootstrap, tmp_path, t.topic, tier_segment_bytes=4096)
    tier_in_process(s)
    by_hour = t.env(TIERPROXY_ICEBERG_PARTITION_BY="partition,hour(timestamp)")  # both tables by hour as well
    iceberg_cli(tmp_path, *t.args("--once"), env=by_hour)
    uri, wh = f"sqlite:///{tmp_path}/tier/iceberg/catalog.db", f"file://{tmp_path}/tier/iceberg"
    assert [f.name for f in pyiceberg_table(uri, wh, t.table).spec().fields] == ["_kafka_partition",
                                                                               "_kafka_timestamp_hour"]
    assert [f.name for f in pyiceberg_table(uri, wh, f"{t.table}_dlq").spec().fields] == ["topic", "partition",
                                                                                        "timestamp_hour"]

    def offsets(name: str, column: str) -> list[int]:
        return sorted(pyiceberg_table(uri, wh, name).scan().to_arrow().column(column).to_pylist())

    assert offsets(t.table, "_kafka_offset") == [i for i in range(600) if i % 10 != 9]
    assert offsets(f"{t.table}_dlq", "offset") == list(range(9, 600, 10))
    cut = 333  # inside a segment: the boundary file is rewritten, not dropped
    proxy = replica(kafka.bootstrap, tmp_path, t.storage, t.metadata)
    try:
        assert delete_records(proxy.bootstrap, t.topic, {0: cut}) == {0: (0, cut)}
    finally:
        proxy.stop()
    iceberg_cli(tmp_path, *t.args("--once"), env=by_hour)
    assert offsets(t.table, "_kafka_offset") == [i for i in range(cut, 600) if i % 10 != 9]
    assert offsets(f"{t.table}_dlq", "offset") == list(range(339, 600, 10))


def _killed_at(t: Typed, point: str, env: dict[str, str]) -> None:
    killed_at([sys.executable, "-m", "tierproxy.cli", "iceberg", *t.args("--once")], t.tmp,
              {**os.environ, "TIERPROXY_TIER_STATE_DIR": str(t.tmp / "state"), **env}, point)


def _latest_on_broker(t: Typed, client: SchemaRegistryClient) -> dict[bytes, dict[str, Any] | None]:
    """Each key's last value as the broker holds it (None: a tombstone), decoded as applications decode it."""
    read = AvroDeserializer(client)
    ctx = SerializationContext(t.topic, MessageField.VALUE)
    ends = {p: watermarks(t.kafka.bootstrap, t.topic, p)[1] for p in (0, 1)}
    c = Consumer({"bootstrap.servers": t.kafka.bootstrap, "group.id": f"latest-{time.monotonic_ns()}",
                  "enable.auto.commit": False, "auto.offset.reset": "earliest", "isolation.level": "read_committed"})
    c.subscribe([t.topic])
    out: dict[bytes, dict[str, Any] | None] = {}
    seen = {0: -1, 1: -1}
    try:
        for _ in range(600):
            if all(seen[p] >= ends[p] - 1 for p in (0, 1)):
                break
            m = c.poll(0.5)
            if m is None or m.error():
                continue
            seen[m.partition()] = m.offset()
            if m.key() is not None:
                out[m.key()] = None if m.value() is None else read(m.value(), ctx)
    finally:
        c.close()
    return out


def test_upsert_holds_the_latest_value_per_key_tombstones_delete_and_a_killed_pass_reruns(
        kafka: KafkaCluster, schema_registry: Registry, tmp_path: Path) -> None:
    from tests.support.tiering import settings
    from tests.support.tiering import tier_once as tier_in_process

    t = Typed(kafka, schema_registry, tmp_path, f"typed-upsert-{os.getpid()}")
    # a keyed topic with updates and tombstones, as a CDC topic is (a compacted one is never tiered: KIP-405's rule)
    create_topic(kafka.bootstrap, t.topic, partitions=2)
    env = t.env(TIERPROXY_ICEBERG_MODE="upsert")
    uri, wh = f"sqlite:///{tmp_path}/tier/iceberg/catalog.db", f"file://{tmp_path}/tier/iceberg"
    ctx = SerializationContext(t.topic, MessageField.VALUE)
    s = settings(kafka.bootstrap, tmp_path, t.topic, tier_segment_bytes=2048)

    def table_now() -> dict[bytes, tuple[int, str, int]]:
        rows = pyiceberg_table(uri, wh, t.table).scan().to_arrow().to_pylist()
        keys = [r["_kafka_key"] for r in rows]
        assert len(keys) == len(set(keys)), "one row per key"
        return {r["_kafka_key"]: (r["id"], r["item"], r["qty"]) for r in rows}

    def expected(latest: dict[bytes, dict[str, Any] | None]) -> dict[bytes, tuple[int, str, int]]:
        return {k: (v["id"], v["item"], v["qty"]) for k, v in latest.items() if v is not None}

    with SchemaRegistryClient({"url": schema_registry.url, "timeout": 30}) as client:
        ser = AvroSerializer(client, V1)
        p = Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 5, "enable.idempotence": True})

        def produce(round_: int, keys: range, tombstones: range) -> None:
            for k in keys:
                p.produce(t.topic, ser({"id": k, "item": f"r{round_}-k{k}", "qty": round_, "at": round_}, ctx),
                          f"key-{k}".encode(), partition=k % 2)
            for k in tombstones:
                p.produce(t.topic, None, f"key-{k}".encode(), partition=k % 2)
            p.produce(t.topic, ser({"id": -1, "item": "no key", "qty": 0, "at": 0}, ctx), partition=round_ % 2)
            assert p.flush(30) == 0

        produce(0, range(60), range(0))
        produce(1, range(0, 60, 2), range(0, 60, 7))  # half the keys updated, every 7th deleted
        tier_in_process(s)
        out = iceberg_cli(tmp_path, *t.args("--once"), env=env)
        latest = _latest_on_broker(t, client)
        assert table_now() == expected(latest) and len(expected(latest)) == 60 - len(range(0, 60, 7)), out.stdout
        dlq = pyiceberg_table(uri, wh, f"{t.table}_dlq").scan().to_arrow()
        assert dlq.column("error").to_pylist() == [
            "no key: iceberg.mode=upsert keeps the latest value per Kafka key"] * 2

        # more: updates, a deleted key written again, another deleted; the pass killed before its commit, rerun
        produce(2, range(0, 60, 3), range(1, 60, 10))
        tier_in_process(s)
        before = table_now()
        _killed_at(t, "files", env)
        assert table_now() == before  # nothing of the killed pass
        iceberg_cli(tmp_path, *t.args("--once"), env=env)
        latest = _latest_on_broker(t, client)
        assert table_now() == expected(latest) != before
        assert latest[b"key-0"] is not None and latest[b"key-21"] is None  # written again; deleted in round 2
        snap = pyiceberg_table(uri, wh, t.table).current_snapshot().snapshot_id
        iceberg_cli(tmp_path, *t.args("--once"), env=env)  # a rerun changes nothing
        assert pyiceberg_table(uri, wh, t.table).current_snapshot().snapshot_id == snap
        leftovers = list((tmp_path / "tier").rglob("*_tombstones*/**/*.parquet"))
        assert leftovers == [], "the pass's intermediate files are gone"
