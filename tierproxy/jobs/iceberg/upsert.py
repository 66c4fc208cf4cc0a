"""Upsert mode (`iceberg.mode=upsert`): a typed table holding the latest value per Kafka key, as of the tiered offset.

A record's key is its Kafka key's bytes (what log compaction compares). Per key the latest record is the one with
the highest offset in its partition (Kafka's rule); a key met in several partitions (a producer that changed its
partitioner) keeps the one with the latest timestamp, then the higher partition. Keys compete within an incarnation
of the topic: a topic created again under the same name starts its keys afresh, beside the old one's rows a kept
table keeps. The table's row of a key competes with a pass's records by the same rule, so where passes cut does not
change the result. A tombstone (a null value)
as the latest record deletes the key's row; a record without a key cannot be upserted and is a dead letter. (A
key deleted by a tombstone has no row left to compete: a later pass's record of that key from another partition
with an older timestamp then makes a row again, where one pass holding both would not.)

The executors write a pass's typed rows as in append mode, and each slice's tombstones (key, partition, offset,
timestamp) to a file under `data/_tombstones/`. The driver reads only those four columns of every new file, picks
each key's latest record, and commits in one transaction: the table's rows of every key the pass touched deleted
(copy-on-write: a data file holding one is rewritten without it), the new files kept to their latest rows (a file
rewritten where some of its rows were superseded), the ledger. The driver holds the pass's keys and positions
(the key's bytes and ~40 bytes per new record); the intermediate files go after the commit (a killed pass's, as
orphans).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tierproxy.jobs.iceberg.typed import PREFIX

TOMBSTONES_DIR = "/data/_tombstones/"
CURRENT = -1  # a position of a row already in the table (not of one of the pass's files)
KEY, PARTITION, OFFSET, TIMESTAMP = (f"{PREFIX}key", f"{PREFIX}partition", f"{PREFIX}offset", f"{PREFIX}timestamp")
TOPIC_ID = f"{PREFIX}topic_id"  # the incarnation: keys compete within one (`key_filter`)


def tombstone_schema() -> Any:
    """The Arrow schema of a slice's tombstones file."""
    import pyarrow as pa

    return pa.schema([pa.field(KEY, pa.large_binary(), nullable=False), pa.field(PARTITION, pa.int32(), False),
                      pa.field(OFFSET, pa.int64(), False), pa.field(TIMESTAMP, pa.timestamp("us", "UTC"), False)])


def tombstones_location(table_location: str) -> str:
    """Where a typed table's tombstone files go (`data_file_path` adds data/topic=…/partition=… under it)."""
    return table_location.rstrip("/") + TOMBSTONES_DIR.rstrip("/")


def is_tombstones(path: str) -> bool:
    return TOMBSTONES_DIR in path


@dataclass
class UpsertPlan:
    keys: list[bytes] = field(default_factory=list)  # every key the pass's records touch: their rows go
    files: list[str] = field(default_factory=list)  # data files to add: each holds only its keys' latest rows
    intermediate: list[str] = field(default_factory=list)  # files to delete once committed (or failed)
    rows: int = 0  # rows the table gains (latest values)
    deletes: int = 0  # keys whose latest record is a tombstone


def _last_of_groups(t: Any, group: list[str], order: list[str]) -> Any:
    """The last row of each group of `t` (rows equal in `group`) when sorted by `order` within it."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    t = t.sort_by([(c, "ascending") for c in group + order])
    n = t.num_rows
    if n <= 1:
        return t
    last = np.zeros(n, dtype=bool)
    last[-1] = True
    for c in group:  # a row is its group's last when the next row differs in one of the group's columns
        col = t.column(c).combine_chunks()
        last[:-1] |= pc.not_equal(col.slice(0, n - 1), col.slice(1)).to_numpy(zero_copy_only=False)
    return t.filter(pa.array(last))


def latest(positions: Any) -> Any:
    """Of a table of (key, partition, offset, timestamp, file, row) positions, the rows that are their key's latest
    record (the module's rule), as a table of the same columns."""
    return _last_of_groups(_last_of_groups(positions, [KEY, PARTITION], [OFFSET]), [KEY], [TIMESTAMP, PARTITION])


def plan_upsert(io: Any, paths: list[str], arrow_schema: Any,
                current: Callable[[list[bytes]], Any] | None = None) -> UpsertPlan:
    """The pass's new files (typed rows and tombstones) → what the commit deletes and adds. `current(keys)`: the
    table's rows of those keys (key, partition, offset, timestamp), which compete by the same rule: a key whose
    row in the table is later than every candidate of this pass keeps it (where passes cut never changes which
    record a key ends with)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tierproxy.jobs.iceberg.files import LazyParquet

    plan = UpsertPlan(intermediate=[p for p in paths if is_tombstones(p)])
    parts = []
    for i, path in enumerate(paths):
        with io.new_input(path).open() as f:
            t = pq.read_table(f, columns=[KEY, PARTITION, OFFSET, TIMESTAMP])
        t = pa.table([t.column(KEY).cast(pa.large_binary()), t.column(PARTITION), t.column(OFFSET),
                      t.column(TIMESTAMP).cast(pa.timestamp("us", "UTC")),
                      pa.array(np.full(t.num_rows, i, np.int32)), pa.array(np.arange(t.num_rows, dtype=np.int64))],
                     names=[KEY, PARTITION, OFFSET, TIMESTAMP, "file", "row"])
        parts.append(t)
    if not parts:
        return plan
    positions = pa.concat_tables(parts)
    touched = sorted(set(positions.column(KEY).to_pylist()))
    if current is not None and touched:
        rows = current(touched)
        positions = pa.concat_tables([positions, pa.table(
            [rows.column(KEY).cast(pa.large_binary()), rows.column(PARTITION).cast(pa.int32()),
             rows.column(OFFSET).cast(pa.int64()), rows.column(TIMESTAMP).cast(pa.timestamp("us", "UTC")),
             pa.array(np.full(rows.num_rows, CURRENT, np.int32)), pa.array(np.full(rows.num_rows, -1, np.int64))],
            names=[KEY, PARTITION, OFFSET, TIMESTAMP, "file", "row"])])
    winners = latest(positions)
    standing = {k for k, f in zip(winners.column(KEY).to_pylist(), winners.column("file").to_pylist(), strict=True)
                if f == CURRENT}
    plan.keys = [k for k in touched if k not in standing]  # their rows in the table go
    kept: dict[int, list[int]] = {}
    for f, r in zip(winners.column("file").to_pylist(), winners.column("row").to_pylist(), strict=True):
        if f == CURRENT:
            continue
        if is_tombstones(paths[f]):
            plan.deletes += 1
        else:
            kept.setdefault(f, []).append(r)
    for i, path in enumerate(paths):
        if is_tombstones(path):
            continue
        rows = sorted(kept.get(i, []))
        total = parts[i].num_rows
        plan.rows += len(rows)
        if len(rows) == total:
            plan.files.append(path)
            continue
        plan.intermediate.append(path)
        if not rows:
            continue
        with io.new_input(path).open() as f:
            table = pq.read_table(f).take(pa.array(rows, pa.int64()))
        head, _, tail = path.rpartition("-")
        out = LazyParquet(io, f"{head}-latest-{tail}", arrow_schema)
        for rb in table.cast(arrow_schema).to_batches():
            out.write(rb)
        written = out.close()
        assert written is not None
        plan.files.append(written)
    return plan


def key_filter(keys: list[bytes], topic_id: str | None = None, nulls: bool = True) -> Any:
    """The row filter of every row whose key is one of `keys`; with `topic_id`, of that incarnation's rows only (and,
    with `nulls`, those from before the topic id column: `competing` decides): a re-created topic's keys never
    compete with, nor delete, the rows an older incarnation left in a kept table (`iceberg.retention=keep`)."""
    from pyiceberg import expressions

    # their pydantic signatures hide the (term, literals) constructors from mypy
    make: Any = expressions.In
    equal: Any = expressions.EqualTo
    null: Any = expressions.IsNull
    keyed = make(KEY, set(keys))
    if topic_id is None:
        return keyed
    if not nulls:
        return expressions.And(keyed, equal(TOPIC_ID, topic_id))
    return expressions.And(keyed, expressions.Or(equal(TOPIC_ID, topic_id), null(TOPIC_ID)))


def competing(keys: list[bytes], planned: Any, ledger: Any, topic: str) -> Any:
    """The row filter of the table's rows a pass's `keys` compete with (and delete): `topic`'s current incarnation's
    (`ledger`, the pass's new one, `planned` the one it planned from: `ledger.Ledger`). A row from before the topic
    id column (null there) counts as it only when that incarnation was already the current one (a re-created topic's
    first pass: the nulls are the older one's, whose rows `follow` removes in this commit) and is the one the ledger
    records of the topic (beside another, kept under `iceberg.retention=keep`, they are the older one's): they must
    neither win over the new one's records nor be deleted by them."""
    tid = ledger.topics.get(topic)
    own = tid is None or (planned.topics.get(topic) == tid and ledger.incarnations(topic) == [tid])
    return key_filter(keys, tid, nulls=own)


NO_KEY = "no key: iceberg.mode=upsert keeps the latest value per Kafka key"


def split_for_upsert(rb: Any, dlq_target: Any) -> tuple[Any, Any, Any]:
    """On an executor, a raw table batch → (records to decode, tombstones in `tombstone_schema`, records without a
    key as dead letters in `dlq_target`)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    no_key = pc.is_null(rb.column("key"))
    tombstone = pc.and_(pc.is_null(rb.column("value")), pc.invert(no_key))
    rest = rb.filter(pc.invert(pc.or_(no_key, tombstone)))
    dead = rb.filter(no_key)
    dead = pa.RecordBatch.from_arrays([*dead.columns, pa.array([NO_KEY] * dead.num_rows, pa.large_string())],
                                      names=[*dead.schema.names, "error"]).select(dlq_target.names).cast(dlq_target)
    tombs = rb.filter(tombstone)
    tombs = pa.RecordBatch.from_arrays([tombs.column(c) for c in ("key", "partition", "offset", "timestamp")],
                                       names=[KEY, PARTITION, OFFSET, TIMESTAMP]).cast(tombstone_schema())
    return rest, tombs, dead
