"""One pass of the Iceberg step: plan from the tier, write data files on the executors, commit exactly once, make
the table follow the tier, clean up.

1. The ledger (`ledger`) says where the table ends per partition; the DataFrame reader's planner slices the tier
   from there (a slice per segment or byte range, aborted transactions from the tier's transaction indexes).
2. Executors write one Parquet file per slice (`files`). Under read_committed, a partition's segments from the
   first transaction whose marker is not tiered yet are held back (their files removed) until a later pass.
3. One catalog commit: rows below the tier's start removed (tier retention, DeleteRecords purges: whole files
   dropped, a boundary file rewritten), a deleted topic's rows removed, the new files added, the new ledger in the
   snapshot summary. Killed before it: nothing changed; after it: the ledger has it all.
4. Cleanup: after rows were removed, older snapshots are expired so removed rows are gone for good; data files no
   snapshot references (a killed pass's, expired ones') are deleted once older than `iceberg.orphan.min.age.ms`.

`iceberg.retention=keep` skips 3's removals and 4's expiry: the table keeps what the tier deletes.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import time
import uuid
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tierproxy.iceberg.catalog import CatalogConfig, CatalogError, open_catalog, open_table
from tierproxy.iceberg.files import SliceWritten, write_slice
from tierproxy.iceberg.ledger import LEDGER, WRITER, Ledger, current_ledger
from tierproxy.spark.options import EARLIEST, ReadOptions
from tierproxy.spark.plan import PartitionPlan, Planner, Slice
from tierproxy.tier.model import uuid_bytes, uuid_str
from tierproxy.tier.ownership import check_cluster
from tierproxy.tier.rsm import RemoteStorageManager
from tierproxy.tier.rules import first_open_hole, holes_between, tier_start
from tierproxy.tiering.cluster import ClusterView, describe_cluster

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


@dataclass
class IcebergSummary:
    pass_id: str
    files_added: int = 0
    rows_added: int = 0
    segments_added: int = 0
    files_held_back: int = 0
    rows_deleted: int = 0
    files_deleted: int = 0  # physically, after expiry (orphans included)
    snapshots_expired: int = 0
    executor_peak_rss_mb: float = 0.0  # the largest Python worker's peak RSS among this pass's tasks
    executor_base_rss_mb: float = 0.0  # a worker's RSS before its first slice (interpreter, pyarrow, pyiceberg)
    committed: bool = False
    snapshot_id: int | None = None
    lag: dict[str, int] = field(default_factory=dict)  # topic-partition → tier end - table end (offsets)
    seconds: float = 0.0

    def line(self) -> str:
        return (f"iceberg pass {self.pass_id}: {self.segments_added} segments, {self.files_added} files, "
                f"{self.rows_added} rows added; {self.files_held_back} files held back; {self.rows_deleted} rows "
                f"removed; {self.snapshots_expired} snapshots expired; {self.files_deleted} files deleted; "
                f"lag {sum(self.lag.values())} offsets; snapshot {self.snapshot_id} in {self.seconds:.1f}s")


class TableBusy(CatalogError):
    """Another pass holds the table (its single-writer lease): this pass changes nothing."""


def writer_of(table: Any, max_age_ms: int) -> str | None:
    """The pass holding the table's writer lease, None when none does (or its lease is older than `max_age_ms`:
    that pass died, and its files are orphans)."""
    raw = table.properties.get(WRITER, "")
    pass_id, _, started = raw.partition(" ")
    if not pass_id or not started.isdigit():
        return None
    return pass_id if time.time() * 1000 - int(started) < max_age_ms else None


class SegmentDataError(RuntimeError):
    """A tiered segment's bytes cannot become rows (a batch fails its CRC, a record runs past its batch)."""


class TablePlanner(Planner):
    """The reader's planner, keeping its partition plans and which recorded topic ids the tier has deleted."""

    def __init__(self, options: ReadOptions, recorded: dict[str, str]) -> None:
        super().__init__(options)
        self.recorded = recorded
        self.plans: list[PartitionPlan] = []
        self.gone: set[str] = set()  # topics whose recorded incarnation is deleted (their rows go)

    def _planned(self, view: ClusterView, plans: list[PartitionPlan], rlmm: Any) -> None:
        self.plans = plans
        ids = {p.topic: uuid_str(p.topic_id) for p in view.partitions}
        for topic, tid in self.recorded.items():
            if ids.get(topic) == tid:
                continue
            # re-created (a new id), or gone from the cluster and its partitions deleted from the tier too; a topic
            # merely missing from one Metadata answer keeps its rows
            if topic in ids or rlmm.cache.is_deleted(uuid_bytes(tid), 0):
                self.gone.add(topic)


def _pause_point(name: str) -> None:
    """Where a test kills the step with SIGKILL (TIERPROXY_ICEBERG_PAUSE_AT=name:marker-file)."""
    spec = os.environ.get("TIERPROXY_ICEBERG_PAUSE_AT", "")
    if spec.split(":", 1)[0] == name:
        with open(spec.split(":", 1)[1], "a"):
            pass
        time.sleep(3600)


def held_back_from(results: Sequence[SliceWritten]) -> int | None:
    """The first offset of the earliest transaction still open after a partition's slices (in offset order): its
    outcome is not tiered, so nothing from there on may become rows yet. None: every outcome is known."""
    state: dict[int, int] = {}
    for r in results:
        closes = set(r.closes)
        for pid in closes:
            state.pop(pid, None)
        for pid, first in r.opens.items():
            if int(pid) in closes or int(pid) not in state:
                state[int(pid)] = int(first)
    return min(state.values()) if state else None


class IcebergSync:
    """Runs passes against one table with a Spark session from `spark()`."""

    def __init__(self, options: IcebergOptions, spark: Any) -> None:
        self.o = options
        self._spark = spark

    def run_once(self) -> IcebergSummary:
        o = self.o
        summary = IcebergSummary(uuid.uuid4().hex[:12])
        started = time.monotonic()
        view = describe_cluster(o.bootstrap)
        asyncio.run(self._check_owner(view.cluster_id))
        catalog = open_catalog(o.catalog)
        table = open_table(catalog, o.catalog, o.table)
        ledger = current_ledger(table)
        starting: dict[tuple[str, int], int] = {}
        for p in view.partitions:
            end = ledger.ends.get(f"{uuid_str(p.topic_id)}:{p.partition}")
            starting[(p.topic, p.partition)] = end if end is not None and \
                ledger.topics.get(p.topic) == uuid_str(p.topic_id) else EARLIEST
        planner = TablePlanner(ReadOptions(o.bootstrap, o.storage, o.metadata, pattern=o.topics, starting=starting,
                                           include_headers=True, read_committed=o.read_committed,
                                           fail_on_data_loss=False), ledger.topics)
        slices = [s for s in planner.plan() if s.segment is not None]
        holder = writer_of(table, self.o.orphan_min_age_ms)
        if holder is not None:
            raise TableBusy(f"table {o.table} is being written by pass {holder} (a pass's lease lasts at most "
                            f"iceberg.orphan.min.age.ms={o.orphan_min_age_ms}): this pass changed nothing; the "
                            "next one goes on")
        if slices:  # data files about to be written: no other pass may commit, nor clean them up as orphans
            table = self._lease(table, summary.pass_id)
        results = self._write(table, slices, summary.pass_id)

        new = Ledger(dict(ledger.ends), dict(ledger.starts), dict(ledger.topics))
        # the ledger never moves past a hole the tier job may still fill: its rows come when it is filled
        stops = {(pp.info.topic, pp.info.partition): first_open_hole(holes_between(pp.segments),
                                                                     pp.live.log_start if pp.live else None)
                 for pp in planner.plans}
        paths, segments, rejected = self._accept(results, new, summary, stops)
        summary.executor_peak_rss_mb = max((r.peak_rss_kb for r in results), default=0) / 1024
        summary.executor_base_rss_mb = min((r.rss_before_kb for r in results), default=0) / 1024
        deletes = [] if o.keep else self._follow(planner, ledger, new)
        for pp in planner.plans:
            new.topics[pp.info.topic] = uuid_str(pp.info.topic_id)
            key = f"{uuid_str(pp.info.topic_id)}:{pp.info.partition}"
            summary.lag[f"{pp.info.topic}-{pp.info.partition}"] = max(0, pp.tier_end + 1 - new.ends.get(key, 0)) \
                if pp.segments else 0
        self._delete_files(table, rejected)
        _pause_point("files")
        if paths or deletes or new != Ledger(ledger.ends, ledger.starts, ledger.topics):
            summary.rows_deleted = self._commit(table, new, deletes, paths, segments, summary.pass_id)
            summary.committed = True
            table = table.refresh()
        elif WRITER in table.properties:
            table = self._release(table)
        summary.snapshot_id = table.current_snapshot().snapshot_id if table.current_snapshot() else None
        _pause_point("commit")
        if deletes and not o.keep:
            summary.snapshots_expired = self._expire(table)
        summary.files_deleted = self._clean_orphans(table, summary.pass_id)
        summary.seconds = time.monotonic() - started
        return summary

    async def _check_owner(self, cluster_id: str | None) -> None:
        """WrongCluster when the tier belongs to another cluster than the brokers' (`tier.ownership`)."""
        rsm = RemoteStorageManager.from_uri(self.o.storage)
        try:
            await check_cluster(rsm, cluster_id, record=False, brokers=self.o.bootstrap)
        finally:
            await rsm.close()

    # --- the single-writer lease ---------------------------------------------------------------------------------
    def _lease(self, table: Any, pass_id: str) -> Any:
        """Take the table for this pass (a property commit: the catalog's compare-and-swap lets one of two passes
        starting together have it; the other fails cleanly)."""
        try:
            with table.transaction() as tx:
                tx.set_properties({WRITER: f"{pass_id} {int(time.time() * 1000)}"})
        except Exception as exc:
            raise TableBusy(f"table {self.o.table}: another pass took it first ({type(exc).__name__}): this pass "
                            "changed nothing; the next one goes on") from None
        return table.refresh()

    def _release(self, table: Any) -> Any:
        with table.transaction() as tx:
            tx.remove_properties(WRITER)
        return table.refresh()

    # --- write --------------------------------------------------------------------------------------------------
    def _write(self, table: Any, slices: list[Slice], pass_id: str) -> list[SliceWritten]:
        if not slices:
            return []
        from pyiceberg.io.pyarrow import schema_to_pyarrow

        fn = functools.partial(write_slice, self.o.storage, table.location(), self.o.catalog.io,
                               read_committed=self.o.read_committed, pass_id=pass_id,
                               target=schema_to_pyarrow(table.schema()))
        sc = self._spark().sparkContext
        out: list[SliceWritten] = sc.parallelize(slices, len(slices)).map(fn).collect()
        errors = [r.error for r in out if r.error]
        if errors:
            self._delete_files(table, [r.path for r in out if r.path])
            raise SegmentDataError(f"{errors[0]}" + (f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""))
        return out

    def _accept(self, results: list[SliceWritten], new: Ledger, summary: IcebergSummary,
                stops: dict[tuple[str, int], int | None]) -> tuple[list[str], list[str], list[str]]:
        """Files to commit, their segments, and files held back (an undecided transaction, or above an open hole
        in `stops`); advances `new.ends`."""
        by_partition: dict[tuple[str, int], list[SliceWritten]] = defaultdict(list)
        for r in results:
            by_partition[(r.topic, r.partition)].append(r)
        paths: list[str] = []
        segments: list[str] = []
        rejected: list[str] = []
        for (topic, partition), rs in by_partition.items():
            rs.sort(key=lambda r: (r.start, r.byte_start))  # a segment's slices in byte order
            hold = held_back_from(rs) if self.o.read_committed else None
            stop = stops.get((topic, partition))
            if stop is not None:
                log.info("iceberg: %s-%d held back from offset %d: a hole between tiered segments the tier job may "
                         "still fill", topic, partition, stop)
            for r in rs:
                if (hold is not None and r.segment_end >= hold) or (stop is not None and r.start >= stop):
                    summary.files_held_back += r.path is not None
                    if r.path:
                        rejected.append(r.path)
                    continue
                if r.path:
                    paths.append(r.path)
                    summary.files_added += 1
                    summary.rows_added += r.rows
                if r.segment not in segments:
                    segments.append(r.segment)
                key = f"{r.topic_id}:{partition}"
                new.ends[key] = max(new.ends.get(key, 0), r.segment_end + 1)
            if hold is not None:
                log.info("iceberg: %s-%d held back from offset %d: a transaction's outcome is not tiered yet",
                         topic, partition, hold)
        summary.segments_added = len(segments)
        return paths, segments, rejected

    # --- follow the tier ----------------------------------------------------------------------------------------
    def _follow(self, planner: TablePlanner, old: Ledger, new: Ledger) -> list[str]:
        """Row filters to delete: rows below each partition's tier start, and a deleted topic's rows."""
        filters: list[str] = []
        for topic in sorted(planner.gone):
            tid = old.topics.get(topic, "")
            filters.append(f"topic = '{topic}'")  # Kafka topic names never hold a quote
            for d in (new.ends, new.starts):
                for key in [k for k in d if k.startswith(f"{tid}:")]:
                    del d[key]
            new.topics.pop(topic, None)
        for pp in planner.plans:
            key = f"{uuid_str(pp.info.topic_id)}:{pp.info.partition}"
            if old.topics.get(pp.info.topic) != uuid_str(pp.info.topic_id) or key not in old.ends:
                continue  # nothing of this incarnation in the table yet
            start = tier_start(pp.segments, pp.log_start)
            start = pp.log_start if start is None else start  # nothing served: no row below the purge
            if start > old.starts.get(key, 0):
                filters.append(f"topic = '{pp.info.topic}' AND partition = {pp.info.partition} AND offset < {start}")
                new.starts[key] = start
                new.ends[key] = max(new.ends[key], start)
        return filters

    # --- commit -------------------------------------------------------------------------------------------------
    def _commit(self, table: Any, new: Ledger, deletes: list[str], paths: list[str], segments: list[str],
                pass_id: str) -> int:
        """One catalog commit for the whole pass; returns the rows it removed."""
        props = new.summary(pass_id, segments)
        held = writer_of(table.refresh(), self.o.orphan_min_age_ms)
        if held is not None and held != pass_id:  # our lease expired and another pass took the table
            raise TableBusy(f"table {self.o.table} was taken by pass {held} while this one wrote: nothing of this "
                            "pass is in it; the next pass writes it again")
        try:
            with table.transaction() as tx:
                for f in deletes:
                    tx.delete(f, snapshot_properties=props)
                tx.add_files(paths, snapshot_properties=props)
                tx.set_properties({LEDGER: new.property()})  # in the same commit: expiry cannot lose it
                if WRITER in table.properties:
                    tx.remove_properties(WRITER)
        except Exception as exc:
            raise CatalogError(f"commit to table {self.o.table} failed, nothing of this pass is in it: "
                               f"{type(exc).__name__}: {str(exc)[:300]}") from None
        removed = 0
        snap = table.refresh().current_snapshot()
        if deletes and snap is not None:
            from pyiceberg.table.snapshots import ancestors_of

            for s in ancestors_of(snap, table.metadata):
                if (s.summary is None or s.summary.additional_properties.get("tierproxy.pass") != pass_id):
                    break
                removed += int(s.summary.additional_properties.get("deleted-records", 0) or 0)
        return removed

    # --- cleanup ------------------------------------------------------------------------------------------------
    def _expire(self, table: Any) -> int:
        """Expire every snapshot but the current one, so rows removed from the table are not kept by time travel."""
        current = table.current_snapshot()
        old = [s.snapshot_id for s in table.metadata.snapshots if current is None or s.snapshot_id !=
               current.snapshot_id]
        if old:
            table.maintenance.expire_snapshots().by_ids(old).commit()
        return len(old)

    def _delete_files(self, table: Any, paths: list[str]) -> None:
        for p in paths:
            table.io.delete(p)

    def _clean_orphans(self, table: Any, pass_id: str) -> int:
        """Delete data files under the table's data/ that no snapshot references and that are older than the
        orphan age (a killed pass's, and those of expired snapshots)."""
        table = table.refresh()
        if writer_of(table, self.o.orphan_min_age_ms) is not None:
            return 0  # another pass is writing: its files are referenced by no snapshot yet
        referenced: set[str] = set()
        for snap in table.metadata.snapshots:
            for manifest in snap.manifests(table.io):
                for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
                    referenced.add(entry.data_file.file_path)
        cutoff = time.time() - self.o.orphan_min_age_ms / 1000
        n = 0
        for path, mtime in _list_data_files(table):
            if path in referenced or f"-{pass_id}.parquet" in path or mtime > cutoff:
                continue
            table.io.delete(path)
            n += 1
            if n == 1:
                _pause_point("cleanup")
        return n


def _list_data_files(table: Any) -> list[tuple[str, float]]:
    """(URI, modification time) of every Parquet file under the table's data/ directory."""
    from urllib.parse import urlparse

    from pyarrow.fs import FileSelector, FileType

    location = table.location().rstrip("/") + "/data"
    u = urlparse(location)
    fs = table.io.fs_by_scheme(u.scheme, u.netloc)
    base = u.path if u.scheme == "file" else f"{u.netloc}{u.path}"
    prefix = f"{u.scheme}://" if u.scheme != "file" else "file://"
    try:
        infos = fs.get_file_info(FileSelector(base, recursive=True, allow_not_found=True))
    except FileNotFoundError:
        return []
    return [(prefix + i.path, i.mtime.timestamp() if i.mtime else 0.0) for i in infos
            if i.type == FileType.File and i.path.endswith(".parquet")]
