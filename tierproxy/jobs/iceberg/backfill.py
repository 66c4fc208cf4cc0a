"""The one-time backfill of the topic id column (`tierproxy iceberg backfill-topic-ids`).

A table made before the column gained it by schema evolution: its older rows hold null there (`schema.ADDED`). Which
incarnation they are is known from the snapshot of the pass that appended their file, while it is there: its ledger
names each topic's current incarnation, the one that pass added rows of (`appended_under`). Otherwise from the
table's own ledger: a topic with one incarnation recorded (`Ledger.ids`) and no
table end (`tierproxy.ends`) under an id the ledger names for no topic has every row of that id. That is always so
under `iceberg.retention=follow`, where a re-created topic's rows come only in the commit that removes the old ones,
and under `keep` for a topic never re-created. A topic kept with two incarnations before the column existed cannot be
told apart (the rows of both are named by the same topic, partition and offset): its files are left as they are and
named, never guessed.

Each file holding nulls there is rewritten once with the id filled (its rows as they are otherwise, in their order;
a file whose copy does not hold exactly its rows is left out) and swapped for it in one commit under the writer rule:
the backfill takes the table's writer lease from the snapshot it planned from, so a pass running meanwhile, or one
starting, changes nothing of it and it nothing of theirs. The replaced files stay while older snapshots reference
them; a killed backfill's files are orphans (`orphans`), removed by the next pass.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tierproxy.jobs.iceberg.catalog import SOURCE, CatalogError
from tierproxy.jobs.iceberg.ledger import PASS, WRITER, current_ledger, ledger_of
from tierproxy.jobs.iceberg.schema import TOPIC_ID
from tierproxy.jobs.iceberg.typed import PREFIX
from tierproxy.jobs.iceberg.writer import Lease, Renewal, live_lease, made_by, refused, require_at, take

log = logging.getLogger(__name__)
BACKFILL = "tierproxy.backfill"  # snapshot summary key: the backfill that made the snapshot


@dataclass
class Backfilled:
    files: int = 0  # rewritten with the id filled
    rows: int = 0
    left: dict[str, str] = field(default_factory=dict)  # topic → why its rows keep null

    def line(self, table: str) -> str:
        left = "; ".join(f"{t}: {why}" for t, why in sorted(self.left.items()))
        return (f"backfill of {table}: {self.files} files rewritten, {self.rows} rows given their topic id"
                + (f"; left null: {left}" if left else ""))


def columns_of(table: Any) -> tuple[str, str]:
    """The table's topic column and topic id column (a typed table's are `_kafka_`-prefixed)."""
    names = {f.name for f in table.schema().fields}
    return (f"{PREFIX}topic", f"{PREFIX}topic_id") if f"{PREFIX}topic" in names else ("topic", TOPIC_ID)


def incarnation_of(table: Any) -> tuple[dict[str, str], dict[str, str]]:
    """(topic → the id of all its rows, topic → why its rows cannot be told apart), from the table's ledger (and the
    ledgers of its snapshots: which topic an id no longer current was)."""
    led = current_ledger(table)
    named = {tid: topic for snap in table.metadata.snapshots if (old := ledger_of(snap)) is not None
             for topic, tid in old.topics.items()}
    for tid in {key.rpartition(":")[0] for key in led.ends} - set(led.ids):
        if tid in named:  # an incarnation kept through a re-creation, named by an older snapshot's ledger
            led.ids[tid] = named[tid]
    unnamed = sorted({key.rpartition(":")[0] for key in led.ends} - set(led.ids))
    known, left = {}, {}
    for topic in sorted(set(led.ids.values())):
        ids = led.incarnations(topic)
        if len(ids) == 1 and not unnamed:
            known[topic] = ids[0]
        else:
            left[topic] = (f"the table holds incarnations {', '.join(ids + unnamed)} (kept through a re-creation), "
                           "and no pass's own commit still names these rows' (their files rewritten, or that commit "
                           "expired)")
    return known, left


def appended_under(table: Any) -> dict[str, dict[str, str]]:
    """Each data file a pass's own commit added as it wrote it (an append snapshot carrying the ledger, not a
    compaction's, upsert's or backfill's rewrite) → that commit's ledger's current incarnations ({topic: id}): a
    pass adds rows of each topic's current incarnation only, so they are its rows' ids, however many incarnations
    the table holds now. Files whose adding snapshot is expired or another writer's are not named."""
    from tierproxy.jobs.iceberg.compaction import COMPACTION
    from tierproxy.jobs.iceberg.sync import UPSERT

    current = table.current_snapshot()
    if current is None:
        return {}
    topics: dict[int, dict[str, str]] = {}
    for snap in table.metadata.snapshots:
        extra = snap.summary.additional_properties if snap.summary is not None else {}
        led = ledger_of(snap)
        if led is not None and snap.summary.operation.value == "append" and not {COMPACTION, UPSERT, BACKFILL} & set(
                extra):
            topics[snap.snapshot_id] = led.topics
    out: dict[str, dict[str, str]] = {}
    for manifest in current.manifests(table.io):
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            if entry.snapshot_id in topics:
                out[entry.data_file.file_path] = topics[entry.snapshot_id]
    return out


def _file_topic(table: Any, data_file: Any, topic_column: str) -> str | None:
    """The topic a data file's rows are of: its partition's topic value (raw and dead-letter tables), else the one
    topic the table is made for (a typed table)."""
    import json

    spec = table.specs()[data_file.spec_id]
    for i, f in enumerate(spec.fields):
        if table.schema().find_column_name(f.source_id) == topic_column and str(f.transform) == "identity":
            return str(data_file.partition[i])
    if SOURCE in table.properties:
        return str(json.loads(table.properties[SOURCE])["topic"])
    topics = set(current_ledger(table).topics)
    return topics.pop() if len(topics) == 1 else None


def backfill(table: Any, name: str, io_properties: dict[str, str], lease_ms: int, load: Callable[[], Any],
             redact: Callable[[str], str] = str) -> Backfilled:
    """Fill the topic id column of `table`'s rows that lack it (module doc), renewing the writer lease every third
    of `lease_ms` while it copies (on a table `load` loads afresh); CatalogError when another pass holds the table
    or committed since this one planned (nothing changed); LookupError when the table has no such column yet."""
    from pyiceberg.io.pyarrow import parquet_file_to_data_file

    result = Backfilled()
    current = table.current_snapshot()
    if current is None:
        return result
    topic_column, id_column = columns_of(table)
    if id_column not in {f.name for f in table.schema().fields}:  # the evolution is a pass's (`catalog.open_table`)
        raise LookupError(f"table {name} has no column {id_column} yet: the next `tierproxy iceberg` pass of it adds "
                          "it (its rows null there); run the backfill after that")
    field_id = table.schema().find_field(id_column).field_id
    known, ambiguous = incarnation_of(table)
    appended = appended_under(table)
    todo: list[tuple[Any, str]] = []
    for task in table.scan().plan_files():
        df = task.file
        if (df.null_value_counts or {}).get(field_id, df.record_count) == 0:
            continue  # written with the column
        topic = _file_topic(table, df, topic_column)
        tid = appended.get(df.file_path, {}).get(topic or "") or known.get(topic or "")
        if tid is not None:
            todo.append((df, tid))
        elif topic is not None and topic not in result.left:
            result.left[topic] = ambiguous.get(topic, "no incarnation recorded in the table's ledger")
    if not todo:
        return result
    holder = live_lease(table, lease_ms)
    if holder is not None:
        raise CatalogError(f"table {name} is being written by pass {holder.pass_id}: the backfill changed nothing; "
                           "run it again when the pass is done")
    pass_id = f"backfill{uuid.uuid4().hex[:6]}"
    summary = {k: v for k, v in current_ledger(table).summary(pass_id, []).items() if k != PASS}
    lease = Lease.new(pass_id)
    try:
        table, at = take(table, lease, current.snapshot_id, summary)  # one writer: passes now refuse
    except Exception as exc:
        raise CatalogError(f"table {name}: another pass committed or took it meanwhile ({type(exc).__name__}): the "
                           "backfill changed nothing; run it again") from None
    written: list[tuple[Any, str]] = []
    sent = False  # the swap was sent to the catalog: a failure then may hide a commit it applied
    try:
        with Renewal(load, lease, at, lease_ms / 3000, redact):
            misfits = _copy(table, todo, id_column, pass_id, io_properties, written, name)
        for df, _ in misfits:
            topic = _file_topic(table, df, topic_column) or "?"
            result.left[topic] = ("a file written under an older partition spec spans several partitions of the "
                                  "current one (a copy can only be added in the current spec): left as it was")
        table = table.refresh()  # (the renewals changed its properties)
        with table.transaction() as tx:
            require_at(tx, at)
            if written:
                with tx.update_snapshot(snapshot_properties={**summary, BACKFILL: pass_id}).overwrite() as ow:
                    for df, copy in written:
                        ow.delete_data_file(df)
                        ow.append_data_file(parquet_file_to_data_file(table.io, tx.table_metadata, copy))
            tx.remove_properties(WRITER)
            sent = True
    except BaseException as exc:
        if sent and written and not refused(exc) and made_by(table, BACKFILL, pass_id):  # its answer lost
            return _done(result, written)
        if not sent or refused(exc):  # the copies are in no snapshot, nor ever will be
            for _, copy in written:
                table.io.delete(copy)
        # else: its outcome unknown, the copies stay: the orphan rule removes them once no snapshot names them
        try:
            with table.refresh().transaction() as tx:  # give the lease up: nothing of this backfill is in the table
                require_at(tx, at)
                tx.remove_properties(WRITER)
        except Exception as why:
            log.warning("iceberg: backfill of %s: lease not released (%s): it expires", name, type(why).__name__)
        if not isinstance(exc, Exception):
            raise
        outcome = "is not in the table now" if sent and written and not refused(exc) else "changed nothing"
        raise CatalogError(f"table {name}: the backfill {outcome} ({type(exc).__name__}: "
                           f"{redact(str(exc))[:200]}); run it again") from None
    return _done(result, written)


def _done(result: Backfilled, written: list[tuple[Any, str]]) -> Backfilled:
    result.files = len(written)
    result.rows = sum(int(df.record_count) for df, _ in written)
    return result


def _copy(table: Any, todo: list[tuple[Any, str]], id_column: str, pass_id: str, io_properties: dict[str, str],
          written: list[tuple[Any, str]], name: str) -> list[tuple[Any, str]]:
    """Each file of `todo` copied with its null ids filled; (file, copy) added to `written` for those whose copy
    holds exactly their rows and fits one partition of the table's current spec (a copy is added in it). → the
    files of `todo` left out for not fitting (written under an older spec, spanning several of the current one's
    partitions: their rows would be filed under one of them, and hidden from queries filtering on the others)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    from pyiceberg.io import load_file_io
    from pyiceberg.io.pyarrow import parquet_file_to_data_file, schema_to_pyarrow

    from tierproxy.jobs.iceberg.compaction import conform
    from tierproxy.jobs.iceberg.files import ROW_GROUP_ROWS, LazyParquet

    target = schema_to_pyarrow(table.schema())
    misfits: list[tuple[Any, str]] = []
    for df, tid in todo:
        path = f"{df.file_path.removesuffix('.parquet')}-topicids-{pass_id}.parquet"
        fileio = load_file_io(properties=io_properties, location=path)
        out = LazyParquet(fileio, path, target)
        with fileio.new_input(df.file_path).open() as f:
            for rb in pq.ParquetFile(f).iter_batches(batch_size=ROW_GROUP_ROWS):
                rb = conform(rb, target)
                i = rb.schema.get_field_index(id_column)
                out.write(rb.set_column(i, rb.schema.field(i), pc.fill_null(rb.column(i), tid)))
        copy = out.close()
        if copy is None or out.rows != df.record_count:  # rows never change: a short copy is not swapped in
            if copy is not None:
                table.io.delete(copy)
            log.warning("iceberg: backfill of %s: %s left as it was (%d rows copied of %d)", name, df.file_path,
                        out.rows, df.record_count)
            continue
        try:
            parquet_file_to_data_file(table.io, table.metadata, copy)  # its partition in the current spec
        except ValueError as exc:
            table.io.delete(copy)
            log.warning("iceberg: backfill of %s: %s left as it was: %s", name, df.file_path, exc)
            misfits.append((df, tid))
            continue
        written.append((df, copy))
    return misfits
