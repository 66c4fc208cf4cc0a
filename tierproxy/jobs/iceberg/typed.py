"""Typed tables: a topic's values decoded with the Schema Registry into columns, beside a dead-letter table.

A typed table's columns are the value's (`avro_types`: a record's fields at the top level) and the record's Kafka
columns, prefixed `_kafka_` (`_kafka_topic`, `_kafka_partition`, `_kafka_offset`, `_kafka_timestamp`,
`_kafka_timestamp_type`, `_kafka_key`, `_kafka_headers`, `_kafka_leader_epoch`, `_kafka_producer_id`,
`_kafka_topic_id`: the incarnation, `schema.TOPIC_ID`), partitioned by
`_kafka_partition`. Its dead-letter table `<table>_dlq` has the raw table's columns and `error`: every record that
does not become a row is there, so rows + dead letters = the visible records tiered.

Values are in Confluent's wire format: magic byte 0, a 4-byte big-endian schema id, the payload (Avro binary, JSON
text for a JSON Schema, or for Protobuf the message index then the message: `proto_types`).
"""

from __future__ import annotations

import io
import json
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tierproxy.jobs.iceberg.avro_kernel import AvroProgram, binary_buffers, schema_ids
from tierproxy.jobs.iceberg.avro_types import UnsupportedSchema, parse_avro, plain_avro, python_fixer, value_fields
from tierproxy.jobs.iceberg.evolution import fits_reason
from tierproxy.jobs.iceberg.json_types import json_converter, json_value_fields, parse_json_schema
from tierproxy.jobs.iceberg.proto_types import ProtoSchema, proto_reader, proto_value_fields
from tierproxy.jobs.iceberg.registry import RegistryConfig, SchemaNotFound, registry_client
from tierproxy.jobs.iceberg.schema import ADDED

PREFIX = "_kafka_"
# the raw column each Kafka column of a typed table is taken from, and its type (as in schema.COLUMNS)
KAFKA_COLUMNS: tuple[tuple[str, str], ...] = (
    ("topic", "_kafka_topic"), ("partition", "_kafka_partition"), ("offset", "_kafka_offset"),
    ("timestamp", "_kafka_timestamp"), ("timestampType", "_kafka_timestamp_type"), ("key", "_kafka_key"),
    ("headers", "_kafka_headers"), ("leaderEpoch", "_kafka_leader_epoch"), ("producerId", "_kafka_producer_id"),
    ("topicId", "_kafka_topic_id"))
TYPED_ADDED = tuple(typed for raw, typed in KAFKA_COLUMNS if raw in ADDED)  # as `schema.ADDED`
WIRE_HEADER = struct.Struct(">bI")  # magic byte (0), schema id
_STREAM = re.compile(r" from <_io\.BytesIO object at 0x[0-9a-f]+>")


def kafka_fields() -> list[Any]:
    """The Kafka columns of a typed table (placeholder ids: the table assigns its own)."""
    from pyiceberg.types import NestedField

    from tierproxy.jobs.iceberg.schema import iceberg_schema

    raw = {f.name: f for f in iceberg_schema().fields}
    return [NestedField(1000 + i, typed, raw[name].field_type, required=raw[name].required)
            for i, (name, typed) in enumerate(KAFKA_COLUMNS)]


def typed_schema(values: list[Any]) -> Any:
    """A new typed table's schema: the value columns, then the Kafka ones, with fresh ids."""
    from pyiceberg.schema import Schema, assign_fresh_schema_ids

    clash = [f.name for f in values if f.name.startswith(PREFIX)]
    if clash:
        raise UnsupportedSchema(f"value field {clash[0]} starts with {PREFIX}, which the Kafka columns use")
    return assign_fresh_schema_ids(Schema(*values, *kafka_fields()))


def value_columns(schema: Any) -> list[Any]:
    """A typed table's value columns (every column but the Kafka ones)."""
    return [f for f in schema.fields if not f.name.startswith(PREFIX)]


ERROR_ID = 15  # the dead-letter table's `error` column (fixed: its tables were made with it)


def dlq_schema() -> Any:
    """The dead-letter table's schema: the raw table's columns and `error`."""
    from pyiceberg.schema import Schema
    from pyiceberg.types import NestedField, StringType

    from tierproxy.jobs.iceberg.schema import iceberg_schema

    return Schema(*iceberg_schema().fields, NestedField(ERROR_ID, "error", StringType(), required=True))


@dataclass(frozen=True)
class DecodePlan:
    """What the driver decided before the executors decode: each version's schema whose records become rows, each
    one whose records are dead letters (and why); any other id is looked up by the executor and must fit."""

    registry: RegistryConfig | None  # None: a value format without the registry
    accepted: dict[int, tuple[str, str]] = field(default_factory=dict)  # schema id → (schema type, schema text)
    rejected: dict[int, str] = field(default_factory=dict)  # schema id → the reason its records are dead letters
    record: bool = True  # the value schema is a record (its fields are the columns), else one `value` column
    value_format: str = "registry"  # iceberg.value.format: registry, or string / bytes (one `value` column)


def plain_fields(value_format: str) -> list[Any]:
    """The value column of a table of a format without schemas: `value`, string or binary, optional."""
    from pyiceberg.types import BinaryType, NestedField, StringType

    return [NestedField(1, "value", StringType() if value_format == "string" else BinaryType(), required=False)]


def schema_fields(schema_type: str, text: str) -> list[Any]:
    """A registered schema's value columns (placeholder ids); UnsupportedSchema when it has none."""
    kind = schema_type.upper()
    if kind == "AVRO":
        return value_fields(parse_avro(text))
    if kind == "JSON":
        return json_value_fields(parse_json_schema(text))
    if kind == "PROTOBUF":
        return proto_value_fields(ProtoSchema(text).message)
    raise UnsupportedSchema(f"{schema_type} values are not decoded (Avro, Protobuf and JSON Schema are)")


def is_record(schema_type: str, text: str) -> bool:
    """The schema's values are records/objects whose fields are the columns (else one `value` column)."""
    if schema_type.upper() == "PROTOBUF":
        return True  # a message's fields
    try:
        parsed = json.loads(text)
    except ValueError:
        return False
    if not isinstance(parsed, dict):
        return False
    if schema_type.upper() == "JSON":
        return parsed.get("type") == "object" and "properties" in parsed
    return parsed.get("type") == "record"


Reader = Callable[[bytes, int], dict[str, Any]]  # (value, schema id) → columns; ValueError: a dead letter


def avro_reader(text: str, record: bool) -> Reader:
    """Reads a value's Avro payload (after the 5-byte header) into column values as Arrow's raw types take them
    (`arrow_raw_type`: timestamps and times as microseconds, dates as days)."""
    import fastavro

    parsed, fix = fastavro.parse_schema(plain_avro(json.loads(text))), python_fixer(parse_avro(text))
    read_one = fastavro.schemaless_reader

    def read(value: bytes, schema_id: int) -> dict[str, Any]:
        body = io.BytesIO(value)
        body.seek(WIRE_HEADER.size)
        try:
            decoded = read_one(body, parsed, None)
        except Exception as exc:  # fastavro raises whatever the bytes provoke (EOFError, ValueError, ...)
            said = _STREAM.sub("", str(exc))  # its EOFError names the stream's address: the reason would vary
            raise ValueError(f"payload does not match schema id {schema_id}: {type(exc).__name__}: "
                             f"{said[:200]}") from None
        if left := len(value) - body.tell():
            raise ValueError(f"payload has {left} bytes past the end of schema id {schema_id}'s value")
        if fix is not None:
            decoded = fix(decoded)
        return decoded if record and isinstance(decoded, dict) else {"value": decoded}
    return read


def json_reader(text: str, record: bool) -> Reader:
    convert = json_converter(json_value_fields(parse_json_schema(text)), record)

    def read(value: bytes, schema_id: int) -> dict[str, Any]:
        try:
            doc = json.loads(value[WIRE_HEADER.size:])
        except ValueError as exc:  # UnicodeDecodeError too
            raise ValueError(f"payload is not JSON: {str(exc)[:200]}") from None
        try:
            return convert(doc)
        except ValueError as exc:
            raise ValueError(f"payload does not match schema id {schema_id}: {exc}") from None
    return read


def arrow_raw_type(t: Any) -> Any:
    """The Arrow type column values are built in before one cast to `t`: timestamps and times as int64
    microseconds, dates as int32 days, nested alike."""
    import pyarrow as pa

    if pa.types.is_timestamp(t) or pa.types.is_time(t):
        return pa.int64()
    if pa.types.is_date(t):
        return pa.int32()
    if pa.types.is_struct(t):
        return pa.struct([t.field(i).with_type(arrow_raw_type(t.field(i).type)) for i in range(t.num_fields)])
    if pa.types.is_large_list(t):
        return pa.large_list(t.value_field.with_type(arrow_raw_type(t.value_type)))
    if pa.types.is_list(t):
        return pa.list_(t.value_field.with_type(arrow_raw_type(t.value_type)))
    if pa.types.is_map(t):
        return pa.map_(t.key_field.with_type(arrow_raw_type(t.key_type)),
                       t.item_field.with_type(arrow_raw_type(t.item_type)))
    return t


class ValueDecoder:
    """On an executor: a value's bytes → the row's value columns, or the reason it is a dead letter."""

    def __init__(self, plan: DecodePlan, columns: list[Any]) -> None:
        self.plan = plan
        self.columns = columns  # the table's value columns after this pass's evolution
        self._readers: dict[int, Reader | str] = dict(plan.rejected)
        self._programs: dict[int, AvroProgram | None] = {}
        self._texts: dict[int, tuple[str, str]] = {}  # schema id → (type, text) of the ids read here

    def decode_batch(self, values: Any, target: Any) -> tuple[Any, Any, list[int], list[str]]:
        """A column of values → (the rows that decode, their columns as a struct array of `target`'s raw types,
        the rows that are dead letters, their reasons), rows as indices in order. Avro schemas of flat records go
        through the compiled loop (`avro_kernel`), every other value (and any the loop cannot read) through
        `decode`, with the same result."""
        import numpy as np
        import pyarrow as pa

        n = len(values)
        parts: list[tuple[Any, Any]] = []
        by_value = np.ones(n, np.bool_)
        if self.plan.value_format == "registry" and n:
            data, starts, ends, present = binary_buffers(values)
            ids = schema_ids(data, starts, ends, present)
            for schema_id in np.unique(ids[ids >= 0]).tolist():
                program = self._program(schema_id)
                if program is None:
                    continue
                got = program.run(data, starts, ends, np.flatnonzero(ids == schema_id), target)
                if got is not None:
                    parts.append(got)
                    by_value[got[0]] = False
        ok: list[int] = []
        rows: list[dict[str, Any]] = []
        dead: list[int] = []
        reasons: list[str] = []
        left = np.flatnonzero(by_value)
        for i, v in zip(left.tolist(), values.take(pa.array(left)).to_pylist(), strict=True):
            columns, reason = self.decode(v)
            if columns is None:
                dead.append(i)
                reasons.append(str(reason))
            else:
                ok.append(i)
                rows.append(columns)
        if rows or not parts:
            try:
                built = pa.array(rows, type=target)
            except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):  # a value its column cannot hold
                ok, built = self._unfit(ok, rows, target, dead, reasons)
            parts.append((np.array(ok, np.int64), built))
        if len(parts) == 1:
            return parts[0][0], parts[0][1], dead, reasons
        indices = np.concatenate([p[0] for p in parts])
        order = np.argsort(indices, kind="stable")
        return indices[order], pa.concat_arrays([p[1] for p in parts]).take(pa.array(order)), dead, reasons

    @staticmethod
    def _unfit(ok: list[int], rows: list[dict[str, Any]], target: Any, dead: list[int],
               reasons: list[str]) -> tuple[list[int], Any]:
        """Rows one by one: a decoded value its column cannot hold (an Avro int past 32 bits, which fastavro reads
        without a check) makes its record a dead letter, not a failed pass. Adds to dead/reasons in offset order."""
        import pyarrow as pa

        kept, fits, letters = [], [], dict(zip(dead, reasons, strict=True))
        for i, row in zip(ok, rows, strict=True):
            try:
                pa.array([row], type=target)
            except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:
                letters[i] = f"a value does not fit its column: {str(exc)[:200]}"
                continue
            kept.append(i)
            fits.append(row)
        dead[:], reasons[:] = sorted(letters), [letters[i] for i in sorted(letters)]
        return kept, pa.array(fits, type=target)

    def _program(self, schema_id: int) -> AvroProgram | None:
        """The compiled loop's program for a schema id whose records become rows; None: read per value."""
        if schema_id not in self._programs:
            reader = self._readers.get(schema_id)
            if reader is None:
                reader = self._readers[schema_id] = self._load(schema_id)
            found = None if isinstance(reader, str) else self._texts.get(schema_id)
            self._programs[schema_id] = (AvroProgram.of(found[1], self.plan.record)
                                         if found is not None and found[0].upper() == "AVRO" else None)
        return self._programs[schema_id]

    def decode(self, value: bytes | None) -> tuple[dict[str, Any] | None, str | None]:
        """(columns, None) or (None, reason)."""
        if value is None:
            return None, "no value (a tombstone)"
        if self.plan.value_format == "bytes":
            return {"value": value}, None
        if self.plan.value_format == "string":
            try:
                return {"value": value.decode("utf-8")}, None
            except UnicodeDecodeError as exc:
                return None, f"value is not UTF-8 ({exc.reason} at byte {exc.start})"
        if len(value) < WIRE_HEADER.size:
            return None, f"value of {len(value)} bytes is shorter than the wire format's 5-byte header"
        magic, schema_id = WIRE_HEADER.unpack_from(value)
        if magic != 0:
            return None, f"magic byte {magic & 0xFF} is not the schema registry wire format's 0"
        reader = self._readers.get(schema_id)
        if reader is None:
            reader = self._readers[schema_id] = self._load(schema_id)
        if isinstance(reader, str):
            return None, reader
        try:
            return reader(value, schema_id), None
        except ValueError as exc:
            return None, str(exc)

    def _load(self, schema_id: int) -> Reader | str:
        """The reader of a schema id, or why its records are dead letters (RegistryUnavailable propagates: the
        pass fails rather than call a record undecodable because the registry was down)."""
        found = self.plan.accepted.get(schema_id)
        if found is None:
            assert self.plan.registry is not None  # a registry-format plan has one
            try:
                registered = registry_client(self.plan.registry).schema(schema_id)
            except SchemaNotFound:
                return f"schema id {schema_id} is not in the schema registry"
            try:
                fields = schema_fields(registered.schema_type, registered.text)
            except UnsupportedSchema as exc:
                return f"schema id {schema_id}: {exc}"
            if why := fits_reason(self.columns, fields):
                return f"schema id {schema_id} does not fit the table: {why}"
            found = (registered.schema_type, registered.text)
        kind, text = found
        self._texts[schema_id] = found
        if kind.upper() == "PROTOBUF":
            return proto_reader(text, WIRE_HEADER.size)
        return (json_reader if kind.upper() == "JSON" else avro_reader)(text, self.plan.record)
