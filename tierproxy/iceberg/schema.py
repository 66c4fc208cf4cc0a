"""The table's schema, partition spec and sort order, and the Arrow schema its data files are written in.

Columns are those of Spark's Kafka source (`key`, `value`, `topic`, `partition`, `offset`, `timestamp`,
`timestampType`, `headers`) plus `leaderEpoch` and `producerId` of each record's batch. Partitioned by `topic` and
`partition` (identity), so a data file never spans two partitions; each file holds one segment's rows in offset
order. Values stay raw bytes: typed columns decoded with a schema registry can be added as extra columns later.
"""

from __future__ import annotations

import re
from typing import Any

# (field id, name, Iceberg type name, required): the one declaration both schemas below are built from
COLUMNS: tuple[tuple[int, str, str, bool], ...] = (
    (1, "key", "binary", False),
    (2, "value", "binary", False),
    (3, "topic", "string", True),
    (4, "partition", "int", True),
    (5, "offset", "long", True),
    (6, "timestamp", "timestamptz", True),
    (7, "timestampType", "int", True),
    (8, "headers", "headers", False),  # list<struct<key: string, value: binary>>, null when a record has none
    (11, "leaderEpoch", "int", True),
    (12, "producerId", "long", True),  # -1 for a record written without a producer id
)
HEADER_ELEMENT_ID, HEADER_KEY_ID, HEADER_VALUE_ID = 13, 9, 10


def iceberg_schema() -> Any:
    from pyiceberg.schema import Schema
    from pyiceberg.types import (
        BinaryType,
        IntegerType,
        ListType,
        LongType,
        NestedField,
        StringType,
        StructType,
        TimestamptzType,
    )

    simple = {"binary": BinaryType(), "string": StringType(), "int": IntegerType(), "long": LongType(),
              "timestamptz": TimestamptzType()}
    headers = ListType(HEADER_ELEMENT_ID, StructType(
        NestedField(HEADER_KEY_ID, "key", StringType(), required=True),
        NestedField(HEADER_VALUE_ID, "value", BinaryType(), required=False)), element_required=True)
    return Schema(*(NestedField(fid, name, headers if kind == "headers" else simple[kind], required=req)
                    for fid, name, kind, req in COLUMNS))


def partition_spec() -> Any:
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.transforms import IdentityTransform

    return PartitionSpec(PartitionField(3, 1000, IdentityTransform(), "topic"),
                         PartitionField(4, 1001, IdentityTransform(), "partition"))


def sort_order() -> Any:
    from pyiceberg.table.sorting import SortField, SortOrder
    from pyiceberg.transforms import IdentityTransform

    return SortOrder(SortField(source_id=5, transform=IdentityTransform()))


def same_columns(a: Any, b: Any) -> bool:
    """Two Iceberg schemas have the same columns (names, types, nullability), field ids aside."""
    def flat(s: Any) -> list[tuple[str, str, bool]]:
        return [(f.name, re.sub(r"\b\d+: ", "", str(f.field_type)), f.required) for f in s.fields]
    return flat(a) == flat(b)
