"""The driver's half of a typed table: its columns from the subject's versions, decided once per version.

Each version of the value subject (`<topic>-value`, the registry's default subject naming) is decided when a pass
first sees it, in version order, by `evolution.change_reason` against the columns so far: compatible (its records
become rows; the table evolves in the pass's commit) or incompatible (its records are dead letters, with the
reason). Decisions are kept in the table property `tierproxy.schemas` ({"<schema id>": null or the reason}), set in
the same commit as the rows they routed, so a version is never decided twice another way.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from tierproxy.jobs.iceberg.avro_types import UnsupportedSchema
from tierproxy.jobs.iceberg.catalog import CatalogConfig, TableShape, load_existing, open_table
from tierproxy.jobs.iceberg.evolution import change_reason, evolve
from tierproxy.jobs.iceberg.registry import RegistryClient, RegistryConfig
from tierproxy.jobs.iceberg.schema import ADDED, same_columns, sort_order, spec_for
from tierproxy.jobs.iceberg.typed import (
    PREFIX,
    TYPED_ADDED,
    DecodePlan,
    dlq_schema,
    is_record,
    kafka_fields,
    plain_fields,
    schema_fields,
    typed_schema,
    value_columns,
)

log = logging.getLogger(__name__)
SCHEMAS = "tierproxy.schemas"


@dataclass(frozen=True)
class TypedOptions:
    registry: RegistryConfig | None  # None: no registry configured (a value format other than `registry`)
    subject: str  # the value subject, "<topic>-value"
    upsert: bool = False  # iceberg.mode=upsert: the latest value per key (`upsert`)
    value_format: str = "registry"  # iceberg.value.format: registry, string or bytes

    @property
    def topic(self) -> str:
        """The one topic the table is made for (its subject is `<topic>-value`)."""
        return self.subject.removesuffix("-value")


@dataclass
class TypedTable:
    """A typed table ready for a pass: the table, its dead-letter table, and what this pass decided."""

    table: Any
    dlq: Any
    plan: DecodePlan
    schema: Any  # the Iceberg schema after this pass's evolution (the data files' field ids)
    evolved: Any | None  # the schema to union into the table in the pass's commit (None: unchanged)
    decisions: dict[str, str | None]  # the new `tierproxy.schemas`


def dlq_name(table: str) -> str:
    return f"{table}_dlq"


def _typed_spec(schema: Any, by: tuple[str, ...]) -> Any:
    return spec_for(schema, by, None, f"{PREFIX}partition", f"{PREFIX}timestamp")


def _typed_order(schema: Any) -> Any:
    from pyiceberg.table.sorting import SortField, SortOrder
    from pyiceberg.transforms import IdentityTransform

    return SortOrder(SortField(source_id=schema.find_field(f"{PREFIX}offset").field_id,
                               transform=IdentityTransform()))


def _has_kafka_columns(schema: Any) -> bool:
    names = {f.name for f in schema.fields}
    return all(f.name in names for f in kafka_fields() if f.name not in TYPED_ADDED)


def _dlq_shape(by: tuple[str, ...], options: TypedOptions, topic_id: str | None) -> TableShape:
    return TableShape(dlq_schema, lambda s: spec_for(s, by, "topic", "partition", "timestamp"), lambda _: sort_order(),
                      lambda s: same_columns(s, dlq_schema(), ADDED), "kafka records a typed table could not decode",
                      options.topic, topic_id, ADDED)


def open_typed(catalog: Any, cfg: CatalogConfig, name: str, options: TypedOptions,
               by: tuple[str, ...] = ("partition",), topic_id: str | None = None) -> TypedTable | None:
    """The typed table and its dead-letter table, created when missing (partitioned by `by`,
    `iceberg.partition.by`) and recording the topic they are made for (`topic_id`: its id now); TableCollision when
    either was made for another topic (`catalog.open_table`); None while the subject has no version whose records
    can be columns (the table waits: nothing is decided, nothing dead-lettered)."""
    if options.value_format != "registry":
        return _open_plain(catalog, cfg, name, options, by, topic_id)
    assert options.registry is not None  # the settings refuse the registry format without a registry
    client = RegistryClient(options.registry)
    try:
        versions = client.versions(options.subject)
    finally:
        client.close()
    existing = load_existing(catalog, cfg, name)
    decisions: dict[str, str | None] = json.loads(existing.properties.get(SCHEMAS, "{}")) if existing else {}
    # the columns are the replay of the accepted versions in version order, never the table's schema as found: a
    # pass killed after creating or evolving the table and before its commit must not make an older version look
    # like a narrowing of its own evolution
    current: list[Any] | None = None
    plan = DecodePlan(options.registry)
    for v in versions:
        key = str(v.id)
        if key not in decisions:
            decisions[key], _ = _decide(v.schema_type, v.text, current)
            if decisions[key] is None:
                log.info("iceberg: table %s takes %s version %d (schema id %d)", name, options.subject, v.version,
                         v.id)
            else:
                decisions[key] = f"{options.subject} version {v.version} (schema id {v.id}): {decisions[key]}"
                log.warning("iceberg: table %s: %s", name, decisions[key])
        if decisions[key] is None:
            fields = schema_fields(v.schema_type, v.text)
            current = fields if current is None else evolve(current, fields)
            plan.accepted[v.id] = (v.schema_type, v.text)
        else:
            plan.rejected[v.id] = str(decisions[key])
    if current is None:
        log.info("iceberg: table %s waits: subject %s has no version whose values can be columns", name,
                 options.subject)
        return None
    first = current
    table = open_table(catalog, cfg, name, TableShape(lambda: typed_schema(first), lambda s: _typed_spec(s, by),
                                                      _typed_order, _has_kafka_columns,
                                                      f"typed values of {options.subject}", options.topic,
                                                      topic_id, TYPED_ADDED), evolve_spec=True)
    evolved = None
    have = value_columns(table.schema())
    wanted = evolve(have, current)  # the table's columns only ever gain columns, widen, or loosen
    if not same_columns(_schema_of(have), _schema_of(wanted)):
        evolved = _schema_of(wanted)
        schema = table.update_schema().union_by_name(evolved)._apply()
    else:
        schema = table.schema()
    dlq = open_table(catalog, cfg, dlq_name(name), _dlq_shape(by, options, topic_id), evolve_spec=True)
    return TypedTable(table, dlq, DecodePlan(options.registry, plan.accepted, plan.rejected, _is_record(plan)), schema,
                      evolved, decisions)


def _open_plain(catalog: Any, cfg: CatalogConfig, name: str, options: TypedOptions, by: tuple[str, ...],
                topic_id: str | None) -> TypedTable:
    """A typed table whose values are one `value` column (iceberg.value.format string or bytes): no registry, no
    versions; a string table's non-UTF-8 values are dead letters."""
    fields = plain_fields(options.value_format)
    table = open_table(catalog, cfg, name, TableShape(lambda: typed_schema(fields), lambda s: _typed_spec(s, by),
                                                      _typed_order, _has_kafka_columns,
                                                      f"{options.value_format} values ({options.subject})",
                                                      options.topic, topic_id, TYPED_ADDED), evolve_spec=True)
    if why := change_reason(value_columns(table.schema()), fields):
        raise ValueError(f"table {name} exists with other value columns than iceberg.value.format="
                         f"{options.value_format} gives: {why}")
    dlq = open_table(catalog, cfg, dlq_name(name), _dlq_shape(by, options, topic_id), evolve_spec=True)
    decisions: dict[str, str | None] = json.loads(table.properties.get(SCHEMAS, "{}"))
    return TypedTable(table, dlq, DecodePlan(options.registry, value_format=options.value_format, record=False),
                      table.schema(), None, decisions)


def _decide(schema_type: str, text: str, current: list[Any] | None) -> tuple[str | None, list[Any]]:
    """(None, its fields) when a version's records can be rows of a table with `current` columns, else (why, [])."""
    try:
        fields = schema_fields(schema_type, text)
    except UnsupportedSchema as exc:
        return str(exc), []
    if current is None:
        return None, fields
    why = change_reason(current, fields)
    return (f"incompatible change: {why}", []) if why else (None, fields)


def _is_record(plan: DecodePlan) -> bool:
    return any(is_record(kind, text) for kind, text in plan.accepted.values())


def _schema_of(fields: list[Any]) -> Any:
    from pyiceberg.schema import Schema, assign_fresh_schema_ids

    return assign_fresh_schema_ids(Schema(*fields))
