"""One tiering pass (`tierproxy tier --once`) or a loop of them, with Spark running the copies.

The driver plans, writes COPY_SEGMENT_STARTED for every planned segment (fresh segment ids), runs one Spark
task per segment (`copy.copy_task`), and writes COPY_SEGMENT_FINISHED with each copied segment's facts as
results stream back. A failed copy is cleaned (objects deleted, DELETE_SEGMENT_*) and retried with a new segment
id; what still fails is left as a hole that the next pass fills first (the copies after it stay: the broker may
have deleted their data since), and fetches inside it are answered from the next tiered segment.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, TypeVar

from tierproxy.config import TierSettings
from tierproxy.jobs.tiering import housekeeping
from tierproxy.jobs.tiering.cluster import (
    ClusterView,
    PartitionInfo,
    PartitionOffsets,
    deleted_topic_ids,
    describe_cluster,
    list_offsets,
    mounted,
    topic_configs,
)
from tierproxy.jobs.tiering.compact import CompactionStep, compacted_partitions
from tierproxy.jobs.tiering.copy import CopyResult, CopyTask, copy_task
from tierproxy.jobs.tiering.describe import build_snapshot
from tierproxy.jobs.tiering.plan import Gap, Range, plan_partition, select_topics, tombstone_risk
from tierproxy.jobs.tiering.replace import delete_retired, retire_shadowed
from tierproxy.jobs.tiering.summary import RunSummary
from tierproxy.tier.model import (
    PassStage,
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    SegmentState,
    TierPass,
    TopicIdPartition,
    new_uuid,
    uuid_bytes,
    uuid_str,
)
from tierproxy.tier.open import open_metadata
from tierproxy.tier.ownership import RestoreInProgress, check_cluster
from tierproxy.tier.requests import added, since
from tierproxy.tier.rlmm import RemoteLogMetadataManager, new_segment
from tierproxy.tier.rsm import RemoteStorageManager
from tierproxy.tier.rules import compacted, tiering_lag, topic_deletions_due, topic_setting
from tierproxy.tier.snapshot import SnapshotWriter

log = logging.getLogger("tierproxy.tier")
T = TypeVar("T")
DEFAULT_DELETE_RETENTION_MS = 86_400_000  # Kafka's log.cleaner.delete.retention.ms


def spark_session(app_name: str, master: str, spark_conf: dict[str, str]) -> Any:
    """The Spark session of a tierproxy job: this Python on the executors, the AWS_* settings of the storage's
    credential chain passed on, `spark.master` unless spark-submit set it."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name).config("spark.ui.enabled", "false") \
        .config("spark.task.maxFailures", "1").config("spark.python.worker.reuse", "true")
    if not os.environ.get("SPARK_SUBMIT_MASTER_SET"):
        builder = builder.master(master)
        if master.startswith("local") and os.environ["PYSPARK_PYTHON"] == sys.executable:
            # the workers are this Python, tierproxy installed: PySpark from its bytecode, not its zip (spark.daemon)
            builder = builder.config("spark.python.daemon.module", "tierproxy.jobs.spark.daemon")
    for k, v in os.environ.items():  # storage credentials from the usual chain reach the executors too
        if k.startswith("AWS_"):
            builder = builder.config(f"spark.executorEnv.{k}", v)
    for k, v in spark_conf.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


@contextlib.contextmanager
def _stop_signals_held() -> Iterator[None]:
    """SIGINT/SIGTERM held until the block ends, then raised again (main thread only). PySpark's gateway JVM,
    interrupted before it connects, never learns that its Python is gone and keeps running; once connected, the
    session's stop ends it. Holding a signal costs at most the JVM's start."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    before = {sig: signal.signal(sig, lambda signum, frame: held.append(signum))
              for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
        if held:
            signal.raise_signal(held[0])


def running_spark() -> Any | None:
    """The SparkSession this process already runs (a notebook's, a PySpark shell's, a test worker's), or None.
    A job given one uses it as it is (its configuration was settled when it started) and never stops it."""
    if "pyspark" not in sys.modules:
        return None  # nothing imported PySpark: no session can be running (and the import costs half a second)
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    if SparkContext._active_spark_context is None:
        return None
    # the active session is the JVM's per thread; a job run in another thread of the process finds the one made
    return SparkSession.getActiveSession() or SparkSession._instantiatedSession


class JobSpark:
    """A job's Spark session, started on first use: the one given (or already running in this process), which the
    job never stops, or one of its own, stopped by `close`."""

    def __init__(self, app_name: str, master: str, spark_conf: dict[str, str], given: Any | None = None) -> None:
        self.app_name, self.master, self.spark_conf = app_name, master, spark_conf
        self._session = given
        self._owned = False

    def __call__(self) -> Any:
        if self._session is None:
            self._session = running_spark()
            if self._session is None:
                with _stop_signals_held():  # raised once the session is ours to stop
                    self._session = spark_session(self.app_name, self.master, self.spark_conf)
                    self._owned = True
        return self._session

    def close(self) -> None:
        if self._owned and self._session is not None:
            self._session.stop()
        self._session, self._owned = None, False


class TieringJob:
    """Owns the RLMM (on a background event loop) and the storage; uses a Spark session (`JobSpark`: the one given,
    or one it starts and stops)."""

    def __init__(self, settings: TierSettings, spark_conf: dict[str, str] | None = None,
                 progress: bool = True, spark: Any | None = None) -> None:
        self.settings = settings
        self.spark_conf = spark_conf or {}
        self.progress = progress
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="tierproxy-rlmm", daemon=True)
        self._thread.start()
        self.rlmm: RemoteLogMetadataManager = open_metadata(settings.metadata, settings.own_bootstrap,
                                                            settings.metadata_checkpoint_dir, settings.identity,
                                                            writer=True)
        self.rsm = RemoteStorageManager.from_uri(settings.storage)
        # its chain carries over between passes, and the metadata view tells it what changed since the last one
        self.snapshots = SnapshotWriter(self.rsm.store, self.rsm.prefix, tracked=True)
        self.spark = JobSpark("tierproxy-tier", settings.spark_master, self.spark_conf, spark)
        self._started = False
        self._files_checked = False
        self._view: ClusterView | None = None  # the cluster as last described: where copies fetch from
        self.serving: TierPass | None = None  # the requested pass the current one serves
        # this pass's compacted partitions: (topic id, partition) → (the tier's newest timestamp before the pass,
        # the topic's delete.retention.ms)
        self._compacted: dict[tuple[bytes, int], tuple[int, int]] = {}

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def close(self) -> None:
        if self._started:
            self.run(self.rlmm.close())
        self.run(self.rsm.close())
        self.spark.close()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()

    # --- one pass ----------------------------------------------------------------------------------------------
    def run_once(self) -> RunSummary:
        s = self.settings
        summary = RunSummary(uuid.uuid4().hex[:12], int(time.time() * 1000))
        started = time.monotonic()
        counted = self.rsm.store.counts.as_dict()  # the driver's requests are this pass's from here
        # first: a refused identity (command.config) fails here with its reason, not as aiokafka's bootstrap error
        view = self._view = describe_cluster(s.own_bootstrap, s.identity)
        self.run(check_cluster(self.rsm, view.cluster_id, record=True, brokers=s.own_bootstrap))
        if not self._started:
            self.run(self.rlmm.start())
            self._started = True
        self.run(self.rlmm.catch_up())
        view = self._view = mounted(view, self.rlmm.cache.aliases)  # restored topics continue their history
        now = int(time.time() * 1000)
        self.serving = self.rlmm.cache.pass_pending(now)  # a pass asked for through the admin API: this one serves it
        if self.serving is not None:  # its asker sees it taken (and stops waiting for a job to take it)
            self.run(self.rlmm.put_tier_pass(TierPass(self.serving.request_id, False, now, stage=PassStage.TAKEN)))
        topics = sorted({p.topic for p in view.partitions})
        configs = topic_configs(s.own_bootstrap, topics, s.identity) if topics else {}
        parts = select_topics(view, s.tier_topics, s.tier_topics_exclude)

        summary.orphans_cleaned = self.run(housekeeping.clean_orphans(self.rlmm, self.rsm, s.tier_orphan_timeout_ms))
        # a killed pass's replacement: finished (its old segments marked), then what was marked long enough deleted
        summary.retired = self.run(retire_shadowed(self.rlmm))
        summary.retired_deleted = self.run(delete_retired(self.rlmm, self.rsm, s.tier_segment_delete_delay_ms))
        summary.partitions_deleted = self._delete_gone_topics(view, summary)

        offsets = list_offsets(view, parts)
        if not self._files_checked:  # after a crash: a file tier's segment recorded finished but short on disk
            short = self.run(housekeeping.recopy_short_files(
                self.rlmm, self.rsm, {k: o.log_start for k, o in offsets.items()}))
            summary.recopied = short.recopied
            summary.errors += [f"LOST {lost}" for lost in short.lost]
            self._files_checked = True
        ranges: list[Range] = []
        self._compacted = {}
        for p in parts:
            o = offsets.get((p.topic, p.partition))
            if o is None:
                continue
            pc = self.rlmm.cache.get(p.topic_id, p.partition)
            tiered_end = pc.latest_tiered_offset() if pc else -1
            if compacted(configs.get(p.topic, {})):
                newest = max((md.max_timestamp_ms for md in pc.finished()), default=-1) if pc else -1
                self._compacted[(p.topic_id, p.partition)] = (newest, int(configs[p.topic].get(
                    "delete.retention.ms", DEFAULT_DELETE_RETENTION_MS)))
            seg_bytes = topic_setting(s.tier_topic_overrides, p.topic, "segment.bytes", s.tier_segment_bytes)
            try:
                rs, gaps = plan_partition(view, p, o, tiered_end, seg_bytes, pc.holes() if pc else [],
                                          pc.log_start_offset if pc else 0)
            except OSError as exc:  # its leader died since the view was taken: the next pass plans it
                log.warning("not planning %s-%d this pass: %s", p.topic, p.partition, exc)
                continue
            for gap in gaps:
                log.error("GAP %s", gap.describe())
                summary.gaps.append(asdict(gap))
            ranges += rs

        self._copy(ranges, summary)
        step = CompactionStep(self.rlmm, self.rsm, s.storage, s.tier_cleaner_dedupe_buffer_size, self.run, self.spark,
                              lambda t: topic_setting(s.tier_topic_overrides, t, "segment.bytes", s.tier_segment_bytes))
        compaction = step.run(compacted_partitions(parts, configs) if s.tier_cleaner_enable else [], configs,
                              {k: o.last_stable for k, o in offsets.items()},
                              {k: o.log_start for k, o in offsets.items()})
        summary.compaction = asdict(compaction)
        summary.errors += compaction.errors
        summary.storage = added(summary.storage, compaction.storage)

        # the tier's own retention, never the broker topic's (that is the local retention: tier.rules)
        retention = {t: (topic_setting(s.tier_topic_overrides, t, "retention.ms", s.tier_retention_ms),
                         topic_setting(s.tier_topic_overrides, t, "retention.bytes", s.tier_retention_bytes))
                     for t in topics}
        view = self._view or view  # leaders may have moved during the copies
        current = {(p.topic_id, p.partition): p for p in view.partitions}
        parts = [current.get((p.topic_id, p.partition), p) for p in parts]
        after = list_offsets(view, parts)
        log_starts = {k: o.log_start for k, o in after.items()}
        kept = self.run(housekeeping.enforce_retention(self.rlmm, self.rsm, retention, log_starts,
                                                       s.tier_retention_max_delete_fraction, s.confirm_retention))
        summary.expired, summary.purged = kept.expired, kept.purged
        summary.retention_refused += kept.refused

        for p in parts:
            o = after.get((p.topic, p.partition))
            pc = self.rlmm.cache.get(p.topic_id, p.partition)
            if o is not None:
                end = pc.latest_tiered_offset() if pc else -1
                summary.lag[f"{p.topic}-{p.partition}"] = tiering_lag(end, o.log_start, o.last_stable)
        self._describe_tier(summary, view, parts, configs, after)
        summary.storage = added(summary.storage, since(counted, self.rsm.store.counts.as_dict()))
        summary.seconds = time.monotonic() - started
        self._write_state(summary)
        return summary

    def _describe_tier(self, summary: RunSummary, view: ClusterView, parts: list[PartitionInfo],
                       configs: dict[str, dict[str, str]], offsets: dict[tuple[str, int], PartitionOffsets]) -> None:
        """The tier's description of itself (`tier.snapshot`), written after the pass: what a restore needs."""
        # before the records (one applied between is in both), and kept by the writer at once: a failure building
        # the snapshot below loses none of them
        self.snapshots.note(self.rlmm.take_changed())
        snap = build_snapshot(summary.run_id, int(time.time() * 1000), view, parts, configs, offsets, self.rlmm,
                              getattr(self.rlmm, "topic", None))
        if snap.groups_unreadable:
            summary.errors.append(f"group offsets not in the tier snapshot: {snap.groups_unreadable}")
        summary.snapshot = self.run(self.snapshots.write(snap))

    def report(self, summary: RunSummary) -> None:
        """Record that this pass served the pass asked for through the admin API (its run turns succeeded or
        failed there)."""
        if self.serving is not None:
            done = TierPass(self.serving.request_id, False, int(time.time() * 1000), summary.line(), summary.exit_code)
            self.run(self.rlmm.put_tier_pass(done))
            self.serving = None

    def wait(self, seconds: float) -> None:
        """Until the next pass is due, or one is asked for through the admin API (looked for every second)."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            time.sleep(min(1.0, left))
            if self._started:
                self.run(self.rlmm.catch_up())
                if (asked := self.rlmm.cache.pass_pending(int(time.time() * 1000))) is not None:
                    log.info("a tiering pass was asked for (run %s): starting it now", asked.request_id)
                    return

    def _delete_gone_topics(self, view: ClusterView, summary: RunSummary) -> int:
        """Tiered topics the cluster no longer lists are asked for by id; those it answers UNKNOWN_TOPIC_ID for,
        in passes at least `tier.topic.delete.delay.ms` apart, leave the tier (`rules.topic_deletions_due`).
        When each was first seen gone is kept in the state directory (lost with it: the delay starts again)."""
        s = self.settings
        listed = {p.topic_id for p in view.partitions}
        cache = self.rlmm.cache
        absent = {tid for (tid, p) in cache.partitions if tid not in listed and not cache.is_deleted(tid, p)}
        # an id inherited from a lost cluster is proven gone only through its alias here (the restored topic):
        # this cluster never had the id itself, and its UNKNOWN_TOPIC_ID for it proves nothing
        asked = {tid: cache.mounts[tid].alias_id if cache.inherited(tid) else tid for tid in absent
                 if not cache.inherited(tid) or cache.mounts[tid].mounted}
        for tid in sorted(absent - set(asked)):
            log.info("tiered topic id %s came from cluster %s and was not restored: kept", uuid_str(tid),
                     cache.mounts[tid].origin_cluster)
        answered = deleted_topic_ids(s.own_bootstrap, set(asked.values()), s.identity)
        gone = {tid for tid, asked_id in asked.items() if asked_id in answered}
        for tid in sorted(absent - gone):
            log.info("tiered topic id %s is not in the cluster's answer but not proven deleted: kept", uuid_str(tid))
        path = Path(s.tier_state_dir) / "topics_gone.json"
        seen = {uuid_bytes(k): int(v) for k, v in json.loads(path.read_text()).items()} if path.exists() else {}
        due, seen = topic_deletions_due(gone, seen, int(time.time() * 1000), s.tier_topic_delete_delay_ms)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({uuid_str(k): v for k, v in seen.items()}, indent=1))
        names = {tid: pc.tp.topic for (tid, _), pc in cache.partitions.items()}
        summary.topics_pending_deletion = sorted(f"{names[t]} ({uuid_str(t)})" for t in gone - due)
        for t in gone - due:
            log.warning("topic %s (id %s) is deleted from the cluster; its tier data goes once it has been gone for "
                        "tier.topic.delete.delay.ms=%d", names[t], uuid_str(t), s.tier_topic_delete_delay_ms)
        deleted, refusal = self.run(housekeeping.delete_gone_topics(
            self.rlmm, self.rsm, due, s.tier_retention_max_delete_fraction, s.confirm_retention))
        if refusal is not None:
            summary.retention_refused.append(refusal)
        return deleted

    def _copy(self, ranges: list[Range], summary: RunSummary) -> None:
        pending = ranges
        moved: set[tuple[bytes, int, int]] = set()  # (topic id, partition, the leader that failed)
        behind: dict[tuple[bytes, int], int] = {}  # (topic id, partition) → the stable end the plan saw
        for attempt in range(1, self.settings.tier_task_max_attempts + 1):
            if not pending:
                return
            if attempt > 1:
                pending = self._await_leaders(pending, moved, behind)
            tasks = self._start(pending)
            retry: list[Range] = []
            moved, behind = set(), {}
            for result in self._run_tasks(tasks):
                t = result.task
                summary.storage = added(summary.storage, result.storage)
                r = next(x for x in pending if (x.part.topic_id, x.part.partition, x.start) ==
                         (t.topic_id, t.partition, t.start))
                if result.ok:
                    self.run(self._finish(result))
                    if not result.empty:
                        summary.segments += 1
                        summary.bytes += result.size
                        if result.removed:
                            self._tombstone_risk(r, result, summary)
                else:
                    summary.failed += 1
                    summary.errors.append(result.error)
                    log.warning("copy of %s-%d [%d, %d) failed (attempt %d): %s", r.part.topic, r.part.partition,
                                r.start, r.end, attempt, result.error)
                    self.run(self._discard(result))
                    if not result.gone:  # data gone from the broker: the next pass reports the gap
                        retry.append(r)
                        if result.leader_moved:
                            moved.add((r.part.topic_id, r.part.partition, r.part.leader))
                        if result.behind:
                            key = (r.part.topic_id, r.part.partition)
                            behind[key] = max(behind.get(key, 0), r.end)
            pending = retry
        for r in pending:  # the segments copied after it stay (the broker may have deleted their data by now)
            log.warning("%s-%d [%d, %d) not copied after %d attempts: left as a hole for the next pass",
                        r.part.topic, r.part.partition, r.start, r.end, self.settings.tier_task_max_attempts)

    def _tombstone_risk(self, r: Range, result: CopyResult, summary: RunSummary) -> None:
        """A copy of a compacted partition met records the cleaner removed: checked once per partition and pass."""
        known = self._compacted.pop((r.part.topic_id, r.part.partition), None)
        if known is not None and (msg := tombstone_risk(r.part, *known, int(time.time() * 1000),
                                                        result.oldest_ms)) is not None:
            log.warning("TOMBSTONES %s", msg)
            summary.tombstone_risks.append(msg)

    def _start(self, ranges: list[Range]) -> list[CopyTask]:
        tasks, mds = [], []
        for r in ranges:
            tp = TopicIdPartition(r.part.topic, r.part.topic_id, r.part.partition)
            seg_id = new_uuid()
            mds.append(new_segment(tp, seg_id, r.start, r.end - 1, -1, {max(r.part.leader_epoch, 0): r.start}, 0,
                                   broker_leader_epoch=max(r.part.leader_epoch, 0)))
            tasks.append(CopyTask(self._leader(r), r.part.topic, r.part.topic_id, r.part.partition, r.start, r.end,
                                  r.first, seg_id, self.settings.storage, r.part.cluster_topic_id or None))
        self.run(self.rlmm.add_segments(mds))
        return tasks

    def _leader(self, r: Range) -> str | None:
        return self._view.brokers.get(r.part.leader) if self._view is not None else None

    def _await_leaders(self, pending: list[Range], moved: set[tuple[bytes, int, int]],
                       behind: dict[tuple[bytes, int], int] | None = None) -> list[Range]:
        """Before a retry: ask the cluster again and, where a copy failed because its leader was unreachable or no
        longer the leader, wait (backoff doubling from `remote.log.manager.task.retry.backoff.ms`, at most
        `...backoff.max.ms` in all) until another broker leads the partition — a killed leader stays in the
        metadata until the controller fences it (broker.session.timeout.ms, 9 s by default) — and where the leader
        answered with a stable end below the plan (`behind`: a new leader), until its stable end reaches the
        planned one. The retried ranges go to the partitions' current leaders and carry their current leader
        epochs."""
        s = self.settings
        behind = behind or {}
        delay = s.remote_log_manager_task_retry_backoff_ms / 1000
        deadline = time.monotonic() + s.remote_log_manager_task_retry_backoff_max_ms / 1000
        while True:
            time.sleep(delay)
            view = mounted(describe_cluster(s.own_bootstrap, s.identity), self.rlmm.cache.aliases)
            current = {(p.topic_id, p.partition): p for p in view.partitions}
            waiting = [k[:2] for k in moved if (p := current.get(k[:2])) is None or p.leader < 0 or p.leader == k[2]]
            waiting += self._still_behind(view, current, behind)
            if not waiting or time.monotonic() + delay >= deadline:
                break
            delay = min(delay * 2, max(0.0, deadline - time.monotonic()))
        if waiting:
            log.warning("%d partitions still have no new leader or one behind the plan after %.1fs; retrying where "
                        "the cluster says", len(waiting), s.remote_log_manager_task_retry_backoff_max_ms / 1000)
        self._view = view
        return [replace(r, part=current.get((r.part.topic_id, r.part.partition), r.part)) for r in pending]

    @staticmethod
    def _still_behind(view: ClusterView, current: dict[tuple[bytes, int], PartitionInfo],
                      behind: dict[tuple[bytes, int], int]) -> list[tuple[bytes, int]]:
        """The partitions of `behind` whose leader's stable end is still below the end the plan saw."""
        parts = {k: p for k in behind if (p := current.get(k)) is not None and p.leader >= 0}
        offsets = list_offsets(view, list(parts.values())) if parts else {}
        return [k for k in behind if k not in parts or
                (o := offsets.get((parts[k].topic, parts[k].partition))) is None or o.last_stable < behind[k]]

    def _run_tasks(self, tasks: list[CopyTask]) -> list[CopyResult]:
        """One Spark task per segment, all in parallel; a live progress bar follows Spark's task counters."""
        sc = self.spark().sparkContext
        rdd = sc.parallelize(tasks, max(1, len(tasks))).map(functools.partial(copy_task,
                                                                              identity=self.settings.identity))
        out: list[list[CopyResult]] = []
        errors: list[BaseException] = []

        def collect() -> None:
            try:
                out.append(rdd.collect())
            except BaseException as exc:
                errors.append(exc)

        worker = threading.Thread(target=collect, name="tierproxy-spark-collect")
        worker.start()
        if self.progress:
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            columns = (TextColumn("[bold]tiering"), BarColumn(), TextColumn("{task.completed}/{task.total} segments"),
                       TimeElapsedColumn())
            with Progress(*columns) as bar:
                t = bar.add_task("copy", total=len(tasks))
                while worker.is_alive():
                    worker.join(0.25)
                    tracker = sc.statusTracker()
                    done = sum(info.numCompletedTasks for sid in tracker.getActiveStageIds()
                               if (info := tracker.getStageInfo(sid)) is not None)
                    bar.update(t, completed=len(tasks) if not worker.is_alive() else done)
        worker.join()
        if errors:
            raise errors[0]
        return out[0]

    async def _finish(self, result: CopyResult) -> None:
        t = result.task
        tp = TopicIdPartition(t.topic, t.topic_id, t.partition)
        seg_id = RemoteLogSegmentId(tp, t.segment_id)
        pc = self.rlmm.cache.get(tp.topic_id, tp.partition)
        planned = pc.segments[seg_id.id] if pc else None
        assert planned is not None
        if result.empty:  # nothing below the LSO in this range after all
            await housekeeping.delete_segment(self.rlmm, self.rsm, planned)
            return
        facts = RemoteLogSegmentMetadata(
            seg_id, result.start_offset, result.end_offset, result.max_timestamp_ms, -1, 0, dict(result.leader_epochs),
            result.size, SegmentState.COPY_SEGMENT_FINISHED, result.txn_index_empty, None, planned.broker_leader_epoch)
        await self.rlmm.finish_copy(facts, result.outcomes)

    async def _discard(self, result: CopyResult) -> None:
        t = result.task
        pc = self.rlmm.cache.get(t.topic_id, t.partition)
        md = pc.segments.get(t.segment_id) if pc else None
        if md is not None:
            await housekeeping.delete_segment(self.rlmm, self.rsm, md)

    def _write_state(self, summary: RunSummary) -> None:
        d = Path(self.settings.tier_state_dir)
        d.mkdir(parents=True, exist_ok=True)
        (d / "last_run.json").write_text(json.dumps(asdict(summary), indent=1))
        gaps_file = d / "gaps.json"
        known = json.loads(gaps_file.read_text()) if gaps_file.exists() else []
        for g in summary.gaps:
            if g not in known:
                known.append(g)
        gaps_file.write_text(json.dumps(known, indent=1))


def run_loop(settings: TierSettings, *, once: bool, spark_conf: dict[str, str] | None = None,
             progress: bool = True, max_passes: int | None = None,
             after_pass: Callable[[TieringJob], None] | None = None, spark: Any | None = None) -> list[RunSummary]:
    """`--once`: one pass. Otherwise a pass every `tier.interval.ms` until interrupted (or `max_passes`).
    `after_pass` runs after each pass with the job (its Spark session): the Iceberg step when one is configured.
    `spark`: a session to use (never stopped here); by default the one running in this process, else its own."""
    job = TieringJob(settings, spark_conf, progress, spark)
    out: list[RunSummary] = []
    refused = 0
    try:
        while True:
            try:
                summary = job.run_once()
            except RestoreInProgress as exc:  # `--once` exits 2 on it; a running job waits for the restore's end
                refused += 1
                if once or (max_passes is not None and len(out) + refused >= max_passes):
                    raise
                log.warning("no tier pass: %s", exc)
                print(f"REFUSED {exc}", flush=True)
                job.wait(settings.tier_interval_ms / 1000)
                continue
            out.append(summary)
            job.report(summary)
            log.info("run %s: %s", summary.run_id, summary.line())
            print(summary.line(), flush=True)
            for refusal in summary.retention_refused:
                print(f"RETENTION REFUSED {refusal}", flush=True)
            for risk in summary.tombstone_risks:
                print(f"TOMBSTONES {risk}", flush=True)
            for g in summary.gaps:
                print(f"GAP {g['topic']}-{g['partition']}: offsets {g['first_missing']}..{g['last_missing']} "
                      "were deleted by the broker before they were tiered", flush=True)
            if after_pass is not None:
                after_pass(job)
            if once or (max_passes is not None and len(out) >= max_passes):
                return out
            job.wait(settings.tier_interval_ms / 1000)
    finally:
        job.close()


__all__ = ["Gap", "JobSpark", "RunSummary", "TieringJob", "run_loop", "running_spark", "spark_session"]
