"""A typed table's columns and decisions from a real schema registry (Apicurio), in process: versions registered
through its Confluent-compatible API, the table created and evolved in a real SQL catalog by `open_typed`."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.registry import Registry
from tierproxy.dev.ports import free_port
from tierproxy.jobs.iceberg.catalog import catalog_config, open_catalog
from tierproxy.jobs.iceberg.registry import RegistryClient, RegistryConfig, RegistryUnavailable, SchemaNotFound
from tierproxy.jobs.iceberg.typed_tables import SCHEMAS, TypedOptions, open_typed

pytestmark = [pytest.mark.registry]


def _register(registry: Registry, subject: str, schema: dict[str, Any], kind: str = "AVRO") -> int:
    body: dict[str, Any] = {"schema": json.dumps(schema)}
    if kind != "AVRO":
        body["schemaType"] = kind
    r = httpx.post(f"{registry.url}/subjects/{subject}/versions", json=body, timeout=30)
    assert r.status_code == 200, r.text
    return int(r.json()["id"])


def _record(*fields: tuple[str, Any]) -> dict[str, Any]:
    return {"type": "record", "name": "R", "fields": [{"name": n, "type": t} for n, t in fields]}


@pytest.fixture
def catalog(tmp_path: Path) -> tuple[Any, Any]:
    cfg = catalog_config(None, f"file://{tmp_path}/tier", str(tmp_path / "state"))
    return open_catalog(cfg), cfg


def test_versions_decide_the_columns_once_and_a_rerun_decides_the_same(schema_registry: Registry,
                                                                       catalog: tuple[Any, Any]) -> None:
    subject = f"orders-{uuid.uuid4().hex[:8]}-value"
    ids = [_register(schema_registry, subject, s) for s in (
        _record(("id", "long"), ("qty", "int")),
        _record(("id", "long"), ("qty", "long")),  # widened
        _record(("id", "int"), ("qty", "long")),  # narrowed: incompatible
        _record(("id", "long"), ("qty", "long"), ("note", ["null", "string"])))]  # added optional
    options = TypedOptions(RegistryConfig(schema_registry.url), subject)
    first = open_typed(*catalog, "kafka.orders", options)
    assert first is not None and first.evolved is None  # created with the columns of all compatible versions
    cols = {f.name: (str(f.field_type), f.required) for f in first.table.schema().fields}
    assert cols["id"] == ("long", True) and cols["qty"] == ("long", True) and cols["note"] == ("string", False)
    assert sorted(first.plan.accepted) == sorted([ids[0], ids[1], ids[3]])
    assert list(first.plan.rejected) == [ids[2]] and "column id is long" in first.plan.rejected[ids[2]]
    assert first.decisions == {str(i): (None if i != ids[2] else first.plan.rejected[ids[2]]) for i in ids}
    # the decisions recorded as a pass's commit records them; then a new version is decided against them
    with first.table.transaction() as tx:
        tx.set_properties({SCHEMAS: json.dumps(first.decisions)})
    ids.append(_register(schema_registry, subject, _record(
        ("id", "long"), ("qty", "long"), ("note", ["null", "string"]), ("channel", ["null", "string"]))))
    again = open_typed(*catalog, "kafka.orders", options)
    assert again is not None and again.evolved is not None and "channel" in {f.name for f in again.schema.fields}
    assert again.plan.rejected == first.plan.rejected and ids[4] in again.plan.accepted
    assert {f.name: f.field_id for f in again.schema.fields if f.name != "channel"} == \
        {f.name: f.field_id for f in first.table.schema().fields}  # field ids stay


def test_a_subject_without_versions_waits_and_creates_nothing(schema_registry: Registry,
                                                              catalog: tuple[Any, Any]) -> None:
    found = open_typed(*catalog, "kafka.nothing", TypedOptions(RegistryConfig(schema_registry.url),
                                                              f"none-{uuid.uuid4().hex[:8]}-value"))
    assert found is None and not catalog[0].table_exists("kafka.nothing")


def test_the_client_tells_unknown_ids_from_an_unreachable_registry(schema_registry: Registry) -> None:
    client = RegistryClient(RegistryConfig(schema_registry.url))
    try:
        with pytest.raises(SchemaNotFound):
            client.schema(2_000_000_000)
    finally:
        client.close()
    down = RegistryClient(RegistryConfig(f"http://user:pw@127.0.0.1:{free_port()}", basic_auth="user:pw",
                                         timeout_s=5))
    try:
        with pytest.raises(RegistryUnavailable) as err:
            down.versions("x-value")
        assert "unreachable" in str(err.value) and "pw" not in str(err.value)  # the password never in the message
    finally:
        down.close()
