"""One pass of the Iceberg step: plan from the tier, write data files on the executors, commit exactly once, make
the table follow the tier, clean up.

1. The ledger (`ledger`) says where the table ends per partition; the DataFrame reader's planner slices the tier
   from there (a slice per segment or byte range, aborted transactions from the tier's transaction indexes).
2. The pass takes the table (`writer`: a lease it renews, taken by a compare-and-swap from the snapshot it planned
   from), then executors write one Parquet file per slice (`files`). Under read_committed, a partition's segments
   from the first transaction whose marker is not tiered yet are held back (their files removed) until later.
3. One catalog commit, again only from that snapshot: rows below the tier's start removed (tier retention,
   DeleteRecords purges: whole files dropped, a boundary file rewritten), a deleted topic's rows removed, the new
   files added, the new ledger in the snapshot summary. Killed before it: nothing changed; after it: the ledger has
   it all; another pass committed meanwhile: refused, nothing of this pass in the table.
4. Cleanup (`cleanup`): after rows were removed, older snapshots are expired so removed rows are gone for good;
   then maintenance by the table's properties (snapshots expired by age and count, manifests merged: `maintenance`);
   files nothing live refers to (a killed pass's, expired snapshots') are deleted once older than
   `iceberg.orphan.min.age.ms` and than a commit of this pass (`orphans`).

`iceberg.retention=keep` skips 3's removals and 4's expiry after them: the table keeps what the tier deletes (the
table's own expiry properties still decide how long its time travel lasts).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import time
import uuid
import warnings
from collections import defaultdict
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from tierproxy.jobs.iceberg.catalog import CatalogConfig, CatalogError, open_catalog, open_table, raw_shape
from tierproxy.jobs.iceberg.cleanup import Cleanup
from tierproxy.jobs.iceberg.compaction import Compacted, CompactionOptions, candidates, compact, plan_groups
from tierproxy.jobs.iceberg.files import SliceWritten, write_slice
from tierproxy.jobs.iceberg.ledger import LEDGER, PASS, WRITER, Ledger, current_ledger
from tierproxy.jobs.iceberg.pauses import pause_point
from tierproxy.jobs.iceberg.registry import RegistryUnavailable
from tierproxy.jobs.iceberg.schema import iceberg_schema, time_bucket
from tierproxy.jobs.iceberg.typed import PREFIX
from tierproxy.jobs.iceberg.typed_files import write_typed_slice
from tierproxy.jobs.iceberg.typed_tables import SCHEMAS, TypedOptions, TypedTable, dlq_name, open_typed
from tierproxy.jobs.iceberg.upsert import KEY, OFFSET, PARTITION, TIMESTAMP, competing, plan_upsert
from tierproxy.jobs.iceberg.writer import Lease, Renewal, live_lease, require_at, take
from tierproxy.jobs.spark.options import EARLIEST, ReadOptions
from tierproxy.jobs.spark.plan import PartitionPlan, Planner
from tierproxy.jobs.spark.slices import Slice
from tierproxy.jobs.tiering.cluster import ClusterView, describe_cluster
from tierproxy.tier.model import uuid_bytes, uuid_str
from tierproxy.tier.ownership import check_cluster
from tierproxy.tier.rsm import RemoteStorageManager
from tierproxy.tier.rules import first_open_hole, holes_between, tier_start

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class IcebergOptions:
    catalog: CatalogConfig
    table: str
    bootstrap: str
    storage: str
    metadata: str | None
    topics: str
    read_committed: bool = True
    keep: bool = False  # iceberg.retention=keep
    orphan_min_age_ms: int = 3_600_000
    writer_lease_ms: int = 30_000  # iceberg.writer.lease.ms
    typed: TypedOptions | None = None  # a typed table of one topic (`topics` then names just it)
    compaction: CompactionOptions = field(default_factory=CompactionOptions)
    partition_by: tuple[str, ...] = ("partition",)  # iceberg.partition.by


@dataclass
class IcebergSummary:
    pass_id: str
    files_added: int = 0
    rows_added: int = 0
    segments_added: int = 0
    files_held_back: int = 0
    rows_deleted: int = 0
    files_deleted: int = 0  # physically, after expiry (orphans included)
    snapshots_expired: int = 0  # after a purge, and by the table's history.expire.* properties
    manifests_merged: int = 0  # the current snapshot's manifests merged (commit.manifest.min-count-to-merge)
    executor_peak_rss_mb: float = 0.0  # the largest Python worker's peak RSS among this pass's tasks
    executor_base_rss_mb: float = 0.0  # a worker's RSS before its first slice (interpreter, pyarrow, pyiceberg)
    committed: bool = False
    snapshot_id: int | None = None
    lag: dict[str, int] = field(default_factory=dict)  # topic-partition → tier end - table end (offsets)
    seconds: float = 0.0
    dead_letters: int = 0  # a typed table's records added to its dead-letter table
    waiting: bool = False  # a typed table's subject has no version yet: nothing was done
    typed: bool = False
    table: str = ""
    files_compacted: int = 0  # small data files replaced by compaction (every table of the pass)
    compacted_into: int = 0  # the files that replaced them

    def line(self) -> str:
        if self.waiting:
            return (f"iceberg pass {self.pass_id}: {self.table} waits: its value subject has no version whose values "
                    "can be columns yet; nothing written")
        return (f"iceberg pass {self.pass_id}: {self.segments_added} segments, {self.files_added} files, "
                f"{self.rows_added} rows added; {self.files_held_back} files held back; {self.rows_deleted} rows "
                f"removed; " + (f"{self.dead_letters} dead letters; " if self.typed else "") +
                (f"{self.files_compacted} files compacted into {self.compacted_into}; " if self.files_compacted
                 else "") +
                f"{self.snapshots_expired} snapshots expired; " +
                (f"{self.manifests_merged} manifests merged; " if self.manifests_merged else "") +
                f"{self.files_deleted} files deleted; "
                f"lag {sum(self.lag.values())} offsets; snapshot {self.snapshot_id} in {self.seconds:.1f}s")


RAW_COLUMNS = ("topic", "partition", "offset")
UPSERT = "tierproxy.upsert"  # snapshot summary key: the pass whose upsert deleted the superseded rows
TYPED_COLUMNS = (f"{PREFIX}topic", f"{PREFIX}partition", f"{PREFIX}offset")


def _rows(r: SliceWritten) -> tuple[tuple[str, ...], int]:
    return r.paths, r.rows


def _dead_letters(r: SliceWritten) -> tuple[tuple[str, ...], int]:
    return r.dlq_paths, r.dlq_rows


@dataclass
class _Accepted:
    paths: list[str] = field(default_factory=list)
    segments: list[str] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)  # written, not committed: deleted
    rows: int = 0
    held_back: int = 0


@dataclass
class _Target:
    """One table a pass writes (the raw table; or a typed table and its dead-letter table, each with its own
    ledger: a pass killed between their commits is completed by the next one, nothing twice)."""

    name: str
    table: Any
    columns: tuple[str, str, str]  # its topic, partition and offset columns (what retention's deletes filter on)
    pick: Callable[[SliceWritten], tuple[tuple[str, ...], int]]  # a slice's files for this table and its rows
    typed: TypedTable | None = None
    ledger: Ledger = field(default_factory=Ledger)  # the table's, as the pass found it
    new: Ledger | None = None
    accepted: _Accepted = field(default_factory=_Accepted)
    deletes: list[str] = field(default_factory=list)
    at: int | None = None  # the snapshot this pass writes from: every commit of it requires the branch still there
    lease: Lease | None = None
    fence_ms: int | None = None  # when this pass last committed (compare-and-swap): no pass planned before can now

    @classmethod
    def of(cls, name: str, table: Any, columns: tuple[str, str, str],
           pick: Callable[[SliceWritten], tuple[tuple[str, ...], int]], typed: TypedTable | None = None) -> _Target:
        ledger = current_ledger(table)
        current = table.current_snapshot()
        return cls(name, table, columns, pick, typed, ledger, at=current.snapshot_id if current else None)


class TableBusy(CatalogError):
    """Another pass holds the table (its live writer lease), or committed since this pass planned: this pass
    changes nothing."""


class SegmentDataError(RuntimeError):
    """A tiered segment's bytes cannot become rows (a batch fails its CRC, a record runs past its batch)."""


class TablePlanner(Planner):
    """The reader's planner, keeping its partition plans and which recorded topic ids the tier has deleted."""

    def __init__(self, options: ReadOptions, recorded: dict[str, str], partitions: dict[str, set[int]],
                 ledgers: Sequence[Any] = ()) -> None:
        super().__init__(options)
        self.ledgers = list(ledgers)  # each table's ledger: where its rows of each partition end
        self.recorded = recorded
        self.partitions = partitions  # per recorded topic id, the partitions the table holds rows of
        self.plans: list[PartitionPlan] = []
        self.gone: set[str] = set()  # topics whose recorded incarnation the tier has deleted (their rows go)
        self.waiting: set[str] = set()  # created again while the tier still holds the recorded incarnation

    def _planned(self, view: ClusterView, plans: list[PartitionPlan], rlmm: Any) -> None:
        """`view` names each topic by the id its history is kept under (a restored topic's: the lost cluster's,
        `tiering.cluster.mounted`), so a table goes on with the same rows across a restore."""
        self.plans = plans
        self.o = replace(self.o, starting=self._starting(view))
        ids = {p.topic: uuid_str(p.topic_id) for p in view.partitions}
        for topic, tid in self.recorded.items():
            if ids.get(topic) == tid:
                continue
            # the table follows the tier's deletions, never its own inference: the recorded incarnation's rows go
            # once the tier has deleted every partition of it (a topic missing from one Metadata answer, or created
            # again, keeps them until then)
            if all(rlmm.cache.is_deleted(uuid_bytes(tid), p) for p in self.partitions.get(tid) or {0}):
                self.gone.add(topic)
            elif topic in ids:  # its new incarnation's rows would collide with the old ones (topic, partition,
                self.waiting.add(topic)  # offset): they wait for the tier to delete the old one
                log.warning("iceberg: topic %s was created again (id %s); its rows of id %s stay while the tier "
                            "holds that incarnation, and the new one's wait for the tier to delete it", topic,
                            ids[topic], tid)


    def _starting(self, view: ClusterView) -> dict[tuple[str, int], int]:
        """Each partition from where every table's rows of its id end (earliest where one holds none)."""
        starting: dict[tuple[str, int], int] = {}
        for p in view.partitions:
            key, tid = f"{uuid_str(p.topic_id)}:{p.partition}", uuid_str(p.topic_id)
            ends = [ledger.ends.get(key) if ledger.topics.get(p.topic) == tid else None for ledger in self.ledgers]
            starting[(p.topic, p.partition)] = EARLIEST if not ends or any(e is None for e in ends) else min(
                e for e in ends if e is not None)
        return starting


def held_back_from(results: Sequence[SliceWritten], decided: Collection[tuple[int, int]] = ()) -> int | None:
    """The first offset of the earliest transaction still open after a partition's slices (in offset order): its
    outcome is not tiered, so nothing from there on may become rows yet. None: every outcome is known. A
    transaction whose outcome the tier records (`decided`: producer id, first offset) is known: its records were
    read as the outcome says (`tier.transactions`), and no marker is waited for."""
    state: dict[int, int] = {}
    for r in results:
        closes = set(r.closes)
        for pid in closes:
            state.pop(pid, None)
        for pid, first in r.opens.items():
            if int(pid) in closes or int(pid) not in state:
                state[int(pid)] = int(first)
    known = set(decided)
    left = [first for pid, first in state.items() if (pid, first) not in known]
    return min(left) if left else None


class IcebergSync:
    """Runs passes against one table with a Spark session from `spark()`."""

    def __init__(self, options: IcebergOptions, spark: Any, clock: Callable[[], float] = time.time) -> None:
        self.o = options
        self._spark = spark
        self._clock = clock  # what snapshot expiry and the orphan age are decided by (`cleanup`)

    def run_once(self) -> IcebergSummary:
        o = self.o
        summary = IcebergSummary(uuid.uuid4().hex[:12], table=o.table)
        started = time.monotonic()
        view = describe_cluster(o.bootstrap)
        asyncio.run(self._check_owner(view.cluster_id))
        catalog = open_catalog(o.catalog)
        typed: TypedTable | None = None
        if o.typed is not None:
            summary.typed = True
            typed = open_typed(catalog, o.catalog, o.table, o.typed, o.partition_by,
                               next((uuid_str(p.topic_id) for p in view.partitions if p.topic == o.typed.topic), None))
            if typed is None:
                summary.waiting = True
                summary.seconds = time.monotonic() - started
                return summary
            targets = [_Target.of(dlq_name(o.table), typed.dlq, RAW_COLUMNS, _dead_letters),
                       _Target.of(o.table, typed.table, TYPED_COLUMNS, _rows, typed)]
        else:
            targets = [_Target.of(o.table, open_table(catalog, o.catalog, o.table, raw_shape(o.partition_by),
                                                      evolve_spec=True), RAW_COLUMNS, _rows)]
        main = targets[-1]
        recorded: dict[str, str] = {}
        partitions: dict[str, set[int]] = defaultdict(set)
        for t in targets:
            recorded.update(t.ledger.topics)
            for key in t.ledger.ends:
                tid, _, partition = key.rpartition(":")
                partitions[tid].add(int(partition))
        planner = TablePlanner(ReadOptions(o.bootstrap, o.storage, o.metadata, pattern=o.topics,
                                           include_headers=True, read_committed=o.read_committed,
                                           fail_on_data_loss=False), recorded, partitions,
                               [t.ledger for t in targets])
        slices = [s for s in planner.plan() if s.segment is not None]
        slices = [s for s in slices if s.topic not in planner.waiting]
        pause_point("planned")
        for t in targets:
            holder = live_lease(t.table, o.writer_lease_ms)
            if holder is not None:
                raise TableBusy(f"table {t.name} is being written by pass {holder.pass_id} (its lease renewed "
                                f"within iceberg.writer.lease.ms={o.writer_lease_ms}): this pass changed nothing; "
                                "the next one goes on")
        renewals = contextlib.ExitStack()
        if slices:  # data files about to be written: no other pass may commit, nor clean them up as orphans
            for t in targets:
                self._lease(t, summary.pass_id)
                renewals.enter_context(self._renewal(t))
        with renewals:
            try:
                self._write_and_commit(o, summary, planner, targets, slices, typed, renewals.close)
            except BaseException:
                for t in targets:  # failed before its commit: the next pass need not wait for the lease
                    if t.lease is not None:
                        self._release(t)
                raise
        pause_point("commit")
        for t in targets:
            done = self._compact(t, summary.pass_id)
            summary.files_compacted += done.files_in
            summary.compacted_into += done.files_out
        snap = main.table.current_snapshot()
        summary.snapshot_id = snap.snapshot_id if snap else None
        cleanup = Cleanup(o.writer_lease_ms, o.orphan_min_age_ms, self._clock)
        for t in targets:
            if t.deletes and not o.keep:
                summary.snapshots_expired += cleanup.after_purge(t.table)
            kept = cleanup.maintain(t, summary.pass_id)
            summary.snapshots_expired += kept.snapshots_expired
            summary.manifests_merged += kept.manifests_merged
            summary.files_deleted += cleanup.clean_orphans(t, summary.pass_id)
        summary.seconds = time.monotonic() - started
        return summary

    def _write_and_commit(self, o: IcebergOptions, summary: IcebergSummary, planner: TablePlanner,
                          targets: list[_Target], slices: list[Slice], typed: TypedTable | None,
                          stop_renewals: Callable[[], None]) -> None:
        main = targets[-1]
        results = self._write(main.table, slices, summary.pass_id, typed)

        # the ledger never moves past a hole the tier job may still fill: its rows come when it is filled
        stops = {(pp.info.topic, pp.info.partition): first_open_hole(holes_between(pp.segments),
                                                                     pp.live.log_start if pp.live else None)
                 for pp in planner.plans}
        decided = {(pp.info.topic, pp.info.partition): set(pp.outcomes) for pp in planner.plans}
        summary.executor_peak_rss_mb = max((r.peak_rss_kb for r in results), default=0) / 1024
        summary.executor_base_rss_mb = min((r.rss_before_kb for r in results), default=0) / 1024
        for t in targets:
            t.new = t.ledger.copy()
            t.accepted = self._accept(results, t, stops, decided)
            t.deletes = [] if o.keep else self._follow(planner, t.ledger, t.new, t.columns)
            for pp in planner.plans:
                if pp.info.topic not in planner.waiting:
                    t.new.topics[pp.info.topic] = uuid_str(pp.info.topic_id)
                    t.new.ids[uuid_str(pp.info.topic_id)] = pp.info.topic  # kept beside an older one under keep
            self._delete_files(t.table, t.accepted.rejected)
        summary.files_added, summary.rows_added = len(main.accepted.paths), main.accepted.rows
        summary.files_held_back, summary.segments_added = main.accepted.held_back, len(main.accepted.segments)
        summary.dead_letters = sum(t.accepted.rows for t in targets if t is not main)
        for pp in planner.plans:
            key = f"{uuid_str(pp.info.topic_id)}:{pp.info.partition}"
            table_end = main.new.ends.get(key, 0) if main.new is not None else 0
            summary.lag[f"{pp.info.topic}-{pp.info.partition}"] = max(
                0, pp.tier_end + 1 - table_end) if pp.segments else 0
        pause_point("files")
        stop_renewals()  # a renewal is a metadata commit too: the catalog would refuse ours for it
        for t in targets:
            if t.accepted.paths or t.deletes or t.new != t.ledger.copy() \
                    or (t.typed is not None and t.typed.evolved is not None):
                removed = self._commit(t, summary.pass_id)
                summary.rows_deleted += removed if t is main else 0
                summary.committed = True
                t.table = t.table.refresh()
                snap = t.table.current_snapshot()
                t.at, t.fence_ms = snap.snapshot_id, snap.timestamp_ms  # a pass that planned before it cannot commit
                if t is not main:
                    pause_point("between")  # the dead letters committed, the typed rows not yet
            elif t.lease is not None:
                self._release(t)

    async def _check_owner(self, cluster_id: str | None) -> None:
        """WrongCluster when the tier belongs to another cluster than the brokers' (`tier.ownership`)."""
        rsm = RemoteStorageManager.from_uri(self.o.storage)
        try:
            await check_cluster(rsm, cluster_id, record=False, brokers=self.o.bootstrap)
        finally:
            await rsm.close()

    # --- the single-writer lease (`writer`) -----------------------------------------------------------------------
    def _lease(self, t: _Target, pass_id: str) -> None:
        """Take the table for this pass if it is still at the snapshot the pass planned from (`writer.take`: of
        two passes planning together one has it; the other changes nothing)."""
        lease = Lease.new(pass_id)
        summary = {k: v for k, v in t.ledger.summary(pass_id, []).items() if k != PASS}
        try:
            t.table, t.at = take(t.table, lease, t.at, summary)
        except Exception as exc:
            # the catalog's first line says which: a refused compare-and-swap, or (SQLite) a lock another holds
            why = self.o.catalog.redact(str(exc).partition("\n")[0])[:200]
            raise TableBusy(f"table {t.name}: another pass committed or took it since this one planned "
                            f"({type(exc).__name__}: {why}): this pass changed nothing; the next one goes on"
                            ) from None
        t.lease = lease

    def _renewal(self, t: _Target) -> Renewal:
        assert t.lease is not None and t.at is not None
        catalog = self.o.catalog
        return Renewal(lambda: open_catalog(catalog).load_table(t.name), t.lease, t.at,
                       self.o.writer_lease_ms / 3000, catalog.redact)

    def _release(self, t: _Target) -> None:
        """Give the lease up (nothing committed); left to expire when the table moved on meanwhile."""
        try:
            with t.table.transaction() as tx:
                require_at(tx, t.at)
                tx.remove_properties(WRITER)
        except Exception as exc:
            log.warning("iceberg: table %s: lease not released (%s): it expires", t.name, type(exc).__name__)
        t.table, t.lease = t.table.refresh(), None

    # --- write --------------------------------------------------------------------------------------------------
    def _write(self, table: Any, slices: list[Slice], pass_id: str, typed: TypedTable | None) -> list[SliceWritten]:
        if not slices:
            return []
        from pyiceberg.io.pyarrow import schema_to_pyarrow

        if typed is None:
            fn: Callable[[Slice], SliceWritten] = functools.partial(
                write_slice, self.o.storage, table.location(), self.o.catalog.io, read_committed=self.o.read_committed,
                pass_id=pass_id, target=schema_to_pyarrow(table.schema()), bucket=time_bucket(table.spec(),
                                                                                            table.schema()))
        else:
            fn = functools.partial(
                write_typed_slice, self.o.storage, (typed.table.location(), typed.dlq.location()), self.o.catalog.io,
                read_committed=self.o.read_committed, pass_id=pass_id,
                targets=(schema_to_pyarrow(iceberg_schema()), schema_to_pyarrow(typed.schema),
                         schema_to_pyarrow(typed.dlq.schema())), plan=typed.plan, table_schema=typed.schema,
                buckets=(time_bucket(typed.table.spec(), typed.schema), time_bucket(typed.dlq.spec(),
                                                                                    typed.dlq.schema())),
                upsert=self.o.typed is not None and self.o.typed.upsert)
        sc = self._spark().sparkContext
        out: list[SliceWritten] = sc.parallelize(slices, len(slices)).map(fn).collect()
        errors = [r for r in out if r.error]
        if errors:
            self._delete_files(table, [p for r in out for p in (*r.paths, *r.dlq_paths)])
            more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
            registry = [r.error for r in errors if r.error_kind == "registry"]
            if registry:
                raise RegistryUnavailable(f"{registry[0]}: nothing of this pass was committed")
            raise SegmentDataError(f"{errors[0].error}{more}")
        return out

    def _accept(self, results: list[SliceWritten], t: _Target, stops: dict[tuple[str, int], int | None],
                decided: Mapping[tuple[str, int], Collection[tuple[int, int]]] | None = None) -> _Accepted:
        """A table's files to commit, their segments, and files held back (an undecided transaction, or above an
        open hole in `stops`) or already in it (a table whose ledger is ahead of the other's); advances `t.new`."""
        by_partition: dict[tuple[str, int], list[SliceWritten]] = defaultdict(list)
        for r in results:
            by_partition[(r.topic, r.partition)].append(r)
        a = _Accepted()
        assert t.new is not None
        for (topic, partition), rs in by_partition.items():
            rs.sort(key=lambda r: (r.start, r.byte_start))  # a segment's slices in byte order
            hold = held_back_from(rs, (decided or {}).get((topic, partition), ())) if self.o.read_committed else None
            stop = stops.get((topic, partition))
            if stop is not None:
                log.info("iceberg: %s-%d held back from offset %d: a hole between tiered segments the tier job may "
                         "still fill", topic, partition, stop)
            for r in rs:
                paths, rows = t.pick(r)
                key = f"{r.topic_id}:{partition}"
                if t.ledger.topics.get(topic) == r.topic_id and r.segment_end < t.ledger.ends.get(key, 0):
                    a.rejected.extend(paths)  # this table has the segment already
                    continue
                if (hold is not None and r.segment_end >= hold) or (stop is not None and r.start >= stop):
                    a.held_back += len(paths)
                    a.rejected.extend(paths)
                    continue
                a.paths.extend(paths)
                a.rows += rows
                if r.segment not in a.segments:
                    a.segments.append(r.segment)
                t.new.ends[key] = max(t.new.ends.get(key, 0), r.segment_end + 1)
            if hold is not None:
                log.info("iceberg: %s-%d held back from offset %d: a transaction's outcome is not tiered yet",
                         topic, partition, hold)
        return a

    # --- follow the tier ----------------------------------------------------------------------------------------
    def _follow(self, planner: TablePlanner, old: Ledger, new: Ledger, columns: tuple[str, str, str]) -> list[str]:
        """Row filters to delete: rows below each partition's tier start, and a deleted topic's rows (`columns`:
        the table's topic, partition and offset columns)."""
        topic_col, partition_col, offset_col = columns
        filters: list[str] = []
        for topic in sorted(planner.gone):
            tid = old.topics.get(topic, "")
            filters.append(f"{topic_col} = '{topic}'")  # Kafka topic names never hold a quote
            for d in (new.ends, new.starts):
                for key in [k for k in d if k.startswith(f"{tid}:")]:
                    del d[key]
            new.topics.pop(topic, None)
            new.ids.pop(tid, None)
        for pp in planner.plans:
            key = f"{uuid_str(pp.info.topic_id)}:{pp.info.partition}"
            if old.topics.get(pp.info.topic) != uuid_str(pp.info.topic_id) or key not in old.ends:
                continue  # nothing of this incarnation in the table yet
            start = tier_start(pp.segments, pp.log_start)
            start = pp.log_start if start is None else start  # nothing served: no row below the purge
            if start > old.starts.get(key, 0):
                filters.append(f"{topic_col} = '{pp.info.topic}' AND {partition_col} = {pp.info.partition} AND "
                               f"{offset_col} < {start}")
                new.starts[key] = start
                new.ends[key] = max(new.ends[key], start)
        return filters

    # --- commit -------------------------------------------------------------------------------------------------
    def _commit(self, t: _Target, pass_id: str) -> int:
        """One catalog commit of a table for the whole pass (a typed table's evolution and schema decisions in it
        too); returns the rows it removed."""
        assert t.new is not None
        table, deletes, paths = t.table, t.deletes, t.accepted.paths
        props = t.new.summary(pass_id, t.accepted.segments)
        upsert, topic = None, ""
        if t.typed is not None and self.o.typed is not None and self.o.typed.upsert:
            from pyiceberg.io.pyarrow import schema_to_pyarrow

            topic = self.o.typed.topic  # the pass's records are of its current incarnation: keys compete in it

            def rows_of(keys: list[bytes]) -> Any:  # the table's rows of the keys, as the pass planned from it
                assert t.new is not None
                return table.scan(row_filter=competing(keys, t.ledger, t.new, topic),
                                  selected_fields=(KEY, PARTITION, OFFSET, TIMESTAMP), snapshot_id=t.at).to_arrow()

            upsert = plan_upsert(table.io, paths, schema_to_pyarrow(t.typed.schema),
                                 rows_of if t.at is not None else None)
            paths = upsert.files
        from pyiceberg.exceptions import CommitFailedException

        moved = TableBusy(f"table {t.name} moved on since this pass planned (another pass committed): nothing of "
                          "this pass is in it; its files are left to the orphan rule")
        current = table.refresh().current_snapshot()
        if (current.snapshot_id if current else None) != t.at:  # seen early; the catalog checks it in the commit
            raise moved
        try:
            with table.transaction() as tx:
                require_at(tx, t.at)  # the compare-and-swap: first, so it is the commit's one snapshot requirement
                if t.typed is not None:
                    if t.typed.evolved is not None:
                        with tx.update_schema() as update:
                            update.union_by_name(t.typed.evolved)
                    tx.set_properties({SCHEMAS: json.dumps(t.typed.decisions, sort_keys=True)})
                if upsert is not None and upsert.keys and table.current_snapshot() is not None:
                    # the superseded rows first, in a snapshot of their own (not counted as rows removed below)
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")  # pyiceberg warns when no row matched: a key's first value
                        tx.delete(competing(upsert.keys, t.ledger, t.new, topic), snapshot_properties={UPSERT: pass_id})
                for f in deletes:
                    tx.delete(f, snapshot_properties=props)
                tx.add_files(paths, snapshot_properties=props)
                tx.set_properties({LEDGER: t.new.property()})  # in the same commit: expiry cannot lose it
                if WRITER in table.properties:
                    tx.remove_properties(WRITER)
        except CommitFailedException:
            raise moved from None
        except Exception as exc:
            raise CatalogError(f"commit to table {t.name} failed, nothing of this pass is in it: "
                               f"{type(exc).__name__}: {self.o.catalog.redact(str(exc))[:300]}") from None
        t.lease = None
        if upsert is not None:
            self._delete_files(table, upsert.intermediate)
            log.info("iceberg: table %s (upsert): %d keys touched, %d latest values added, %d deleted by tombstones",
                     t.name, len(upsert.keys), upsert.rows, upsert.deletes)
        removed = 0
        snap = table.refresh().current_snapshot()
        if deletes and snap is not None:
            from pyiceberg.table.snapshots import ancestors_of

            for s in ancestors_of(snap, table.metadata):
                if (s.summary is None or s.summary.additional_properties.get("tierproxy.pass") != pass_id):
                    break
                removed += int(s.summary.additional_properties.get("deleted-records", 0) or 0)
        return removed

    # --- compaction ---------------------------------------------------------------------------------------------
    def _compact(self, t: _Target, pass_id: str) -> Compacted:
        """Merge the table's small files (`compaction`) under this pass's lease; a table another pass holds, or
        a compaction that loses a race, is left for a later pass."""
        options = self.o.compaction
        table = t.table.refresh()
        if options.target_bytes <= 0 or live_lease(table, self.o.writer_lease_ms) is not None:
            return Compacted()
        groups = plan_groups(candidates(table, t.columns[2]), options)
        if not groups:
            return Compacted()
        current = table.current_snapshot()
        t.table, t.at = table, current.snapshot_id if current else None
        try:
            self._lease(t, pass_id)  # compaction plans from the table as it is now
        except TableBusy as exc:
            return Compacted(skipped=str(exc))
        table = t.table
        sc = self._spark().sparkContext

        def run(fn: Any, jobs: list[Any]) -> list[Any]:
            return list(sc.parallelize(jobs, len(jobs)).map(fn).collect())

        props = {k: v for k, v in current_ledger(table).summary(pass_id, []).items() if k != PASS}
        try:
            done = compact(table, t.columns[2], options, pass_id, self.o.catalog.io, run, props,
                           before_commit=lambda: pause_point("compaction"), groups=groups)
        finally:
            t.table = table.refresh()
            snap = t.table.current_snapshot()
            if snap is not None and snap.snapshot_id != t.at:  # committed (its overwrite released the lease)
                t.at, t.fence_ms, t.lease = snap.snapshot_id, snap.timestamp_ms, None
            elif t.lease is not None:  # nothing committed: the lease is still ours
                self._release(t)
        table = t.table
        if done.files_in:
            log.info("iceberg: table %s: %d small files compacted into %d (%d rows)", t.name, done.files_in,
                     done.files_out, done.rows)
        return done

    # --- cleanup ---------------------------------------------------------------------------------------------
    def _delete_files(self, table: Any, paths: list[str]) -> None:
        for p in paths:
            table.io.delete(p)
