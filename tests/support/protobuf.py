"""Protobuf schemas for the typed-table tests, built as descriptors (no protoc here) with their message classes, as
an application's generated code would have them; and the bundled text the registry client hands the decoders."""

from __future__ import annotations

import base64
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, timestamp_pb2, wrappers_pb2

F = descriptor_pb2.FieldDescriptorProto
OPTIONAL, REPEATED = F.LABEL_OPTIONAL, F.LABEL_REPEATED


def order_file(*, qty: int = F.TYPE_INT32, item: int = F.TYPE_STRING, channel: bool = False,
               name: str = "order.proto") -> descriptor_pb2.FileDescriptorProto:
    """`Address` first, then `Order` (which uses it, so Order is the table's message): every kind of field the type
    mapping covers. `qty` and `item` can change type and `channel` be added, as a schema's versions do."""
    fd = descriptor_pb2.FileDescriptorProto(name=name, package="shop", syntax="proto3")
    fd.dependency.extend(["google/protobuf/timestamp.proto", "google/protobuf/wrappers.proto"])
    address = fd.message_type.add(name="Address")
    address.field.add(name="city", number=1, type=F.TYPE_STRING, label=OPTIONAL)
    address.field.add(name="zip", number=2, type=F.TYPE_STRING, label=OPTIONAL, proto3_optional=True,
                      oneof_index=0)
    address.oneof_decl.add(name="_zip")
    state = fd.enum_type.add(name="State")
    state.value.add(name="NEW", number=0)
    state.value.add(name="PAID", number=1)
    order = fd.message_type.add(name="Order")
    order.field.add(name="id", number=1, type=F.TYPE_INT64, label=OPTIONAL)
    order.field.add(name="item", number=2, type=item, label=OPTIONAL)
    order.field.add(name="qty", number=3, type=qty, label=OPTIONAL)
    order.field.add(name="at", number=4, type=F.TYPE_MESSAGE, type_name=".google.protobuf.Timestamp", label=OPTIONAL)
    order.field.add(name="tags", number=5, type=F.TYPE_STRING, label=REPEATED)
    entry = order.nested_type.add(name="CountsEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=F.TYPE_STRING, label=OPTIONAL)
    entry.field.add(name="value", number=2, type=F.TYPE_INT64, label=OPTIONAL)
    order.field.add(name="counts", number=6, type=F.TYPE_MESSAGE, type_name=".shop.Order.CountsEntry", label=REPEATED)
    order.field.add(name="state", number=7, type=F.TYPE_ENUM, type_name=".shop.State", label=OPTIONAL)
    order.field.add(name="ship", number=8, type=F.TYPE_MESSAGE, type_name=".shop.Address", label=OPTIONAL)
    order.field.add(name="big", number=9, type=F.TYPE_UINT64, label=OPTIONAL)
    order.field.add(name="memo", number=10, type=F.TYPE_MESSAGE, type_name=".google.protobuf.StringValue",
                    label=OPTIONAL)
    order.field.add(name="raw", number=11, type=F.TYPE_BYTES, label=OPTIONAL)
    if channel:
        order.field.add(name="channel", number=12, type=F.TYPE_STRING, label=OPTIONAL)
    return fd


def message_classes(fd: descriptor_pb2.FileDescriptorProto) -> dict[str, Any]:
    """The file's message classes by name, in a pool of their own (versions of one file do not clash)."""
    pool = descriptor_pool.DescriptorPool()
    for known in (timestamp_pb2, wrappers_pb2):
        pool.AddSerializedFile(known.DESCRIPTOR.serialized_pb)
    pool.Add(fd)
    return {m.name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{fd.package}.{m.name}"))
            for m in fd.message_type}


def bundle(*files: descriptor_pb2.FileDescriptorProto) -> str:
    """What the registry client hands the decoders for a schema: its references' files, then its own, as base64."""
    return base64.b64encode(descriptor_pb2.FileDescriptorSet(file=list(files)).SerializeToString()).decode()
