"""The table's schema, partition spec and sort order, and the Arrow schema its data files are written in.

Columns are those of Spark's Kafka source (`key`, `value`, `topic`, `partition`, `offset`, `timestamp`,
`timestampType`, `headers`) plus `leaderEpoch` and `producerId` of each record's batch, and `topicId`: the topic id
(Kafka's textual Uuid) the row was written under, which tells a re-created topic's incarnations apart (`ADDED`: a
table made before it gains it as an optional column; its older rows hold null). Partitioned by `topic`, then
`iceberg.partition.by` (default `partition`, identity; or the hour or day of `timestamp`), so a data file never spans
two table partitions; each file holds rows of one segment in offset order. Values stay raw bytes (typed tables
decode them: `typed`).
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
    (14, "topicId", "string", False),  # the incarnation (null in rows written before the column)
)
HEADER_ELEMENT_ID, HEADER_KEY_ID, HEADER_VALUE_ID = 13, 9, 10
TOPIC_ID = "topicId"
ADDED = (TOPIC_ID,)  # columns a table made before them may lack: added by schema evolution when it is opened


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


def partition_spec(by: tuple[str, ...] = ("partition",)) -> Any:
    """The raw table's spec: `topic`, then `iceberg.partition.by`'s entries."""
    return spec_for(iceberg_schema(), by, "topic", "partition", "timestamp")


def spec_for(schema: Any, by: tuple[str, ...], topic: str | None, partition: str, timestamp: str) -> Any:
    """A table's partition spec: identity of the `topic` column (None: a one-topic table), then each entry of
    `iceberg.partition.by` (`partition`: identity of the `partition` column; `hour(timestamp)` / `day(timestamp)`:
    Iceberg's hour / day transform of the `timestamp` column, fields named `<column>_hour` / `<column>_day`)."""
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.transforms import DayTransform, HourTransform, IdentityTransform

    fields: list[tuple[str, Any, str]] = [(topic, IdentityTransform(), topic)] if topic else []
    for entry in by:
        if entry == "partition":
            fields.append((partition, IdentityTransform(), partition))
        else:
            unit = entry.split("(")[0]
            fields.append((timestamp, HourTransform() if unit == "hour" else DayTransform(), f"{timestamp}_{unit}"))
    return PartitionSpec(*(PartitionField(schema.find_field(col).field_id, 1000 + i, transform, name)
                           for i, (col, transform, name) in enumerate(fields)))


def spec_fields(spec: Any, schema: Any) -> list[tuple[str, str, str]]:
    """A spec's fields as (source column, transform, field name): what two specs are compared by."""
    return [(schema.find_column_name(f.source_id), str(f.transform), f.name) for f in spec.fields]


TIME_UNITS_US = {"hour": 3_600_000_000, "day": 86_400_000_000}


def time_bucket(spec: Any, schema: Any) -> tuple[str, int] | None:
    """(timestamp column, microseconds per bucket) when the spec partitions by its hour or day: a data file holds
    rows of one bucket only."""
    from pyiceberg.transforms import DayTransform, HourTransform

    for f in spec.fields:
        if isinstance(f.transform, (HourTransform, DayTransform)):
            unit = "hour" if isinstance(f.transform, HourTransform) else "day"
            return schema.find_column_name(f.source_id), TIME_UNITS_US[unit]
    return None


def sort_order() -> Any:
    from pyiceberg.table.sorting import SortField, SortOrder
    from pyiceberg.transforms import IdentityTransform

    return SortOrder(SortField(source_id=5, transform=IdentityTransform()))


def same_columns(a: Any, b: Any, added: tuple[str, ...] = ()) -> bool:
    """Two Iceberg schemas have the same columns (names, types, nullability), field ids aside; the columns named in
    `added` may be missing from `a`, and stand anywhere in it (a table that gained them by evolution has them last)."""
    def flat(s: Any) -> list[tuple[str, str, bool]]:
        return [(f.name, re.sub(r"\b\d+: ", "", str(f.field_type)), f.required) for f in s.fields]
    have, want = flat(a), flat(b)
    extra = [c for c in have if c[0] in added]
    return [c for c in have if c[0] not in added] == [c for c in want if c[0] not in added] and all(
        c in want for c in extra)
