"""Protobuf values as Iceberg columns: a message's fields as the table's columns, each record decoded by its schema.

A registered Protobuf schema reaches this module as one self-contained text (`registry.RegistryClient` builds it):
the base64 of a `FileDescriptorSet` whose last file is the schema and the files before it its references. The
table's message is the file's first top-level message no other message of the file uses as a field's type (so
`message Address {…} message Order { Address to = 1; }` gives Order); a record whose message index names another
message is a dead letter.

    double float → double float      int32 sint32 sfixed32 → int      int64 sint64 sfixed64 uint32 fixed32 → long
    uint64 fixed64 → decimal(20, 0)  bool → boolean  string → string  bytes → binary  enum → string (the symbol)
    message → struct      repeated T → list<T>      map<K, V> → map<K, V>
    google.protobuf.Timestamp → timestamptz        google.protobuf.*Value (wrappers) → the wrapped type

Every column is optional: a message field not set, a wrapper not set and a scalar with explicit presence
(`optional`, proto2) not set are null; a proto3 scalar without presence is its default (0, "", false), as a
Protobuf reader sees it. Recursive messages, groups and Any have no Iceberg type (`UnsupportedSchema`).
"""

from __future__ import annotations

import base64
import decimal
import itertools
from collections.abc import Callable, Iterator
from typing import Any

from tierproxy.jobs.iceberg.avro_types import UnsupportedSchema

_WRAPPERS = {f"google.protobuf.{n}Value" for n in ("Double", "Float", "Int64", "UInt64", "Int32", "UInt32", "Bool",
                                                     "String", "Bytes")}
_TIMESTAMP = "google.protobuf.Timestamp"


def descriptor_set(text: str) -> Any:
    """The FileDescriptorSet of a bundled schema text (UnsupportedSchema when it is not one)."""
    from google.protobuf import descriptor_pb2
    from google.protobuf.message import DecodeError

    files = descriptor_pb2.FileDescriptorSet()
    try:
        files.ParseFromString(base64.b64decode(text.encode("ascii"), validate=True))
    except (ValueError, DecodeError) as exc:
        raise UnsupportedSchema(f"not a serialized Protobuf schema: {exc}") from None
    if not files.file:
        raise UnsupportedSchema("a Protobuf schema without a file")
    return files


class ProtoSchema:
    """A bundled schema text loaded: its pool, its file's top-level messages in declaration order, the table's."""

    def __init__(self, text: str) -> None:
        files = descriptor_set(text)
        main = files.file[-1]
        self.pool = _pool(files)
        prefix = f"{main.package}." if main.package else ""
        self.tops = [self.pool.FindMessageTypeByName(prefix + m.name) for m in main.message_type]
        used = {f.message_type.full_name for m in _messages(self.tops) for f in m.fields if f.message_type is not None}
        roots = [m for m in self.tops if m.full_name not in used]
        if not roots:
            raise UnsupportedSchema(f"{main.name} declares no message")
        self.message = roots[0]

    def message_at(self, path: list[int]) -> Any:
        """The message a record's index path names (ValueError when it names none)."""
        candidates, found = self.tops, None
        for i in path:
            if not 0 <= i < len(candidates):
                raise ValueError(f"message index {path} names no message of the schema")
            found = candidates[i]
            candidates = list(found.nested_types)
        return found


def _messages(tops: Any) -> Iterator[Any]:
    for m in tops:
        yield m
        yield from _messages(m.nested_types)


def _pool(files: Any) -> Any:
    from google.protobuf import (
        any_pb2,
        descriptor_pool,
        duration_pb2,
        empty_pb2,
        field_mask_pb2,
        struct_pb2,
        timestamp_pb2,
        wrappers_pb2,
    )

    pool = descriptor_pool.DescriptorPool()
    known = set()
    for m in (any_pb2, duration_pb2, empty_pb2, field_mask_pb2, struct_pb2, timestamp_pb2, wrappers_pb2):
        pool.AddSerializedFile(m.DESCRIPTOR.serialized_pb)
        known.add(m.DESCRIPTOR.name)
    for f in files.file:
        if f.name in known:
            continue
        try:
            pool.Add(f)
        except (TypeError, KeyError, ValueError) as exc:  # a missing import, a clash of names
            raise UnsupportedSchema(f"Protobuf file {f.name}: {exc}") from None
        known.add(f.name)
    return pool


def proto_value_fields(message: Any) -> list[Any]:
    """The table's value columns for a message (placeholder ids), all optional."""
    from pyiceberg.types import NestedField

    ids = itertools.count(1)  # placeholder field ids (the table assigns its own)
    return [NestedField(next(ids), f.name, _type(f, ids, (message.full_name,)), required=False)
            for f in message.fields]


def _type(f: Any, ids: Iterator[int], seen: tuple[str, ...]) -> Any:
    from pyiceberg import types as it

    if f.message_type is not None and f.message_type.GetOptions().map_entry:
        k, v = f.message_type.fields_by_name["key"], f.message_type.fields_by_name["value"]
        kid, vid = next(ids), next(ids)
        return it.MapType(kid, _one(k, ids, seen), vid, _one(v, ids, seen), value_required=False)
    if f.is_repeated:
        return it.ListType(next(ids), _one(f, ids, seen), element_required=True)
    return _one(f, ids, seen)


def _one(f: Any, ids: Iterator[int], seen: tuple[str, ...]) -> Any:
    from google.protobuf.descriptor import FieldDescriptor as F
    from pyiceberg import types as it

    if f.type == F.TYPE_GROUP:
        raise UnsupportedSchema(f"field {f.name} is a group, which has no Iceberg type here")
    if f.type == F.TYPE_MESSAGE:
        m = f.message_type
        if m.full_name == _TIMESTAMP:
            return it.TimestamptzType()
        if m.full_name in _WRAPPERS:
            return _one(m.fields_by_name["value"], ids, seen)
        if m.full_name == "google.protobuf.Any":
            raise UnsupportedSchema(f"field {f.name} is a google.protobuf.Any, which has no Iceberg type here")
        if m.full_name in seen:
            raise UnsupportedSchema(f"message {m.full_name} is recursive (field {f.name}), which has no Iceberg type")
        return it.StructType(*[it.NestedField(next(ids), s.name, _type(s, ids, (*seen, m.full_name)), required=False)
                               for s in m.fields])
    simple = {F.TYPE_DOUBLE: it.DoubleType(), F.TYPE_FLOAT: it.FloatType(), F.TYPE_BOOL: it.BooleanType(),
              F.TYPE_STRING: it.StringType(), F.TYPE_BYTES: it.BinaryType(), F.TYPE_ENUM: it.StringType(),
              F.TYPE_UINT64: it.DecimalType(20, 0), F.TYPE_FIXED64: it.DecimalType(20, 0)}
    if f.type in simple:
        return simple[f.type]
    if f.type in (F.TYPE_INT32, F.TYPE_SINT32, F.TYPE_SFIXED32):
        return it.IntegerType()
    return it.LongType()  # int64, sint64, sfixed64, uint32, fixed32


Convert = Callable[[Any], Any]


def message_converter(message: Any) -> Callable[[Any], dict[str, Any]]:
    """A decoded message → the row's value columns (timestamps as microseconds: `typed.arrow_raw_type`)."""
    fields = [(f.name, _field_reader(f)) for f in message.fields]
    return lambda msg: {name: read(msg) for name, read in fields}


def _field_reader(f: Any) -> Convert:
    name = f.name
    if f.message_type is not None and f.message_type.GetOptions().map_entry:
        key, value = _scalar(f.message_type.fields_by_name["key"]), _scalar(f.message_type.fields_by_name["value"])
        return lambda msg: {key(k): value(v) for k, v in getattr(msg, name).items()}
    if f.is_repeated:
        item = _scalar(f)
        return lambda msg: [item(x) for x in getattr(msg, name)]
    one = _scalar(f)
    if f.has_presence:  # message fields, `optional` scalars, oneof members: unset is null
        return lambda msg: one(getattr(msg, name)) if msg.HasField(name) else None
    return lambda msg: one(getattr(msg, name))


def _scalar(f: Any) -> Convert:
    """One value of field `f` (a map's key or value, a list's element, or the field's own value)."""
    from google.protobuf.descriptor import FieldDescriptor as F

    if f.type == F.TYPE_MESSAGE:
        m = f.message_type
        if m.full_name == _TIMESTAMP:
            return lambda t: t.seconds * 1_000_000 + t.nanos // 1000
        if m.full_name in _WRAPPERS:
            inner = _scalar(m.fields_by_name["value"])
            return lambda w: inner(w.value)
        return message_converter(m)
    if f.type == F.TYPE_ENUM:
        names = {v.number: v.name for v in f.enum_type.values}
        return lambda n: names.get(n, str(n))  # an open enum's number no symbol names yet stays, as text
    if f.type in (F.TYPE_UINT64, F.TYPE_FIXED64):
        return decimal.Decimal
    return lambda v: v


def message_index(value: bytes, at: int) -> tuple[list[int], int]:
    """Confluent's message index after the 5-byte header: a zigzag varint count, then that many zigzag varints
    (count 0 means [0], the first message). Returns the index path and where the payload starts."""
    count, at = _zigzag(value, at)
    if count == 0:
        return [0], at
    if count < 0 or count > 64:
        raise ValueError(f"message index count {count} is not a valid path")
    path = []
    for _ in range(count):
        i, at = _zigzag(value, at)
        path.append(i)
    return path, at


def _zigzag(value: bytes, at: int) -> tuple[int, int]:
    n = shift = 0
    while True:
        if at >= len(value) or shift > 63:
            raise ValueError("the message index is cut short")
        b = value[at]
        at += 1
        n |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return (n >> 1) ^ -(n & 1), at


def proto_reader(text: str, header: int) -> Callable[[bytes, int], dict[str, Any]]:
    """Reads a value (its message index after the `header` bytes, then the message) into the table's columns; a
    record of another message than the table's, or bytes that are not its message, is a ValueError (a dead
    letter)."""
    from google.protobuf import message_factory
    from google.protobuf.message import DecodeError

    schema = ProtoSchema(text)
    parse = message_factory.GetMessageClass(schema.message).FromString
    convert = message_converter(schema.message)

    def read(value: bytes, schema_id: int) -> dict[str, Any]:
        path, at = message_index(value, header)
        named = schema.message_at(path)
        if named.full_name != schema.message.full_name:
            raise ValueError(f"message index {path} names {named.full_name}, not the table's message "
                             f"{schema.message.full_name} (schema id {schema_id})")
        try:
            msg = parse(value[at:])
        except DecodeError as exc:
            raise ValueError(f"payload does not match schema id {schema_id}: {str(exc)[:200]}") from None
        return convert(msg)
    return read
