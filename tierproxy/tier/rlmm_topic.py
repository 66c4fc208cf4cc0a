"""Topic-based RLMM: a compacted metadata topic on the upstream cluster (aiokafka), the default backend.

Topic `__tierproxy_remote_log_metadata` (50 partitions by default; partition = toPositive(murmur2(
"topicId:topic-partition")) % N, as Kafka's RemoteLogMetadataTopicPartitioner), `cleanup.policy=compact`,
`min.cleanable.dirty.ratio=0.1`, `delete.retention.ms=86400000`, `segment.ms=3600000` (the compacted-metadata
KIP). An optional audit topic keeps the full, uncompacted history.

Local checkpoint (flat file per metadata partition, written atomically):
    file  => magic:unsigned_varint(1) metadata_topic_offset:varlong entry*
    entry => length:unsigned_varint key_length:unsigned_varint key value   (value = api_key version payload)
It holds the latest value of every live key up to `metadata_topic_offset` (what compaction would keep), in
offset order; a restart loads it and consumes only the tail after that offset.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import logging
import os
import threading
from pathlib import Path
from typing import Any

from protocol.errors import ProtocolError
from protocol.primitives import Reader, Writer, buffers
from tierproxy.tier.cache import MetadataCache
from tierproxy.tier.model import IllegalStateTransition, RemoteLogSegmentMetadataUpdate, TierPass, TopicMount
from tierproxy.tier.rlmm import CHECKPOINT, MetadataWriteRefused, RemoteLogMetadataManager, WriterFenced
from tierproxy.tier.serde import decode_value, metadata_partition

TOPIC_VISIBLE_ATTEMPTS = 33  # 0.25, 0.5, 1 s, then 2 s: about a minute for a new metadata topic to show


class MetadataTopicMismatch(RuntimeError):
    """The metadata topic exists with settings this manager cannot work with."""


log = logging.getLogger("tierproxy.rlmm")
DEFAULT_TOPIC = "__tierproxy_remote_log_metadata"
TOPIC_CONFIG = {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.1", "delete.retention.ms": "86400000",
                "segment.ms": "3600000", "retention.ms": "-1"}
CHECKPOINT_MAGIC = 2  # 2: one file, positions then live records (1: a file per partition)


class SettlingLeaders(logging.Filter):
    """While the metadata consumer starts, the partitions of a topic just created may have no leader yet: aiokafka's
    fetcher logs each ListOffsets such a partition fails (NotLeaderForPartitionError, LeaderNotAvailableError) as an
    ERROR and retries it. Those records of this topic are held back and counted (`report`: one INFO line); every
    other record passes, and once the start is over the filter is removed."""

    def __init__(self, topic: str) -> None:
        super().__init__()
        self.topic = topic
        self.partitions: set[int] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        from aiokafka.errors import LeaderNotAvailableError, NotLeaderForPartitionError

        err = record.args[-1] if isinstance(record.args, tuple) and record.args else None
        where = err.args[0] if isinstance(err, (NotLeaderForPartitionError, LeaderNotAvailableError)) and err.args \
            else None
        if getattr(where, "topic", None) != self.topic:
            return True
        self.partitions.add(int(getattr(where, "partition", -1)))
        return False

    def report(self) -> None:
        if self.partitions:
            log.info("metadata topic %s: the leaders of %d of its partitions were still being elected as it started "
                     "(retried until they were)", self.topic, len(self.partitions))


class TopicRLMM(RemoteLogMetadataManager):
    def __init__(self, bootstrap: str, *, topic: str = DEFAULT_TOPIC, partitions: int = 50,
                 replication: int | None = None, checkpoint_dir: Path | None = None, audit_topic: str | None = None,
                 topic_config: dict[str, str] | None = None, client_options: dict[str, Any] | None = None,
                 writer: bool = False, stall_timeout_s: float = 60.0) -> None:
        """`writer`: the tier job's view. Its writes go through a transactional producer whose id is the metadata
        topic's (`tierproxy-tier-<topic>`): a second job that starts fences the first (its next write fails with
        WriterFenced), and every reader reads committed writes only. `stall_timeout_s`: a catch-up (or a write
        waiting to be applied) fails once its view has not moved for that long — however long the whole takes
        while it moves (a large topic read without a checkpoint)."""
        super().__init__()
        self.writer_id = f"tierproxy-tier-{topic}" if writer else None
        self.bootstrap = bootstrap
        self.topic = topic
        self.partitions = partitions
        self.replication = replication
        self.checkpoint_dir = checkpoint_dir
        self.audit_topic = audit_topic
        self.topic_config = {**TOPIC_CONFIG, **(topic_config or {})}
        self.client_options = client_options or {}
        self.positions: dict[int, int] = {}
        self.records_consumed = 0
        self.stall_timeout_s = stall_timeout_s
        self._progress = asyncio.Condition()
        self._producer: Any = None
        self._consumer: Any = None
        self._task: asyncio.Task[None] | None = None

    # --- lifecycle ---------------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Create the topic if needed, load the checkpoint, consume to the end. A start that fails leaves nothing
        behind (clients stopped, view emptied), so the caller's retry starts afresh."""
        settling, fetcher = SettlingLeaders(self.topic), logging.getLogger("aiokafka.consumer.fetcher")
        fetcher.addFilter(settling)  # a topic just created: its leaders settle as the consumer starts
        try:
            await self._start()
        except BaseException:
            await self._stop_clients()
            self.cache, self.keys, self.values, self.positions = MetadataCache(), {}, {}, {}
            raise
        finally:
            fetcher.removeFilter(settling)
            settling.report()

    async def _stop_clients(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None
        for client in (self._consumer, self._producer):
            if client is not None:
                with contextlib.suppress(Exception):
                    await client.stop()
        self._consumer = self._producer = None

    async def _start(self) -> None:
        from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

        self._producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap, acks="all", enable_idempotence=True,
                                          transactional_id=self.writer_id, **self.client_options)
        self._consumer = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, enable_auto_commit=False, group_id=None,
                                          auto_offset_reset="earliest", isolation_level="read_committed",
                                          # a fetch's long poll holds the connection's other requests (the
                                          # end offsets of every catch-up): 0.1 s, not 0.5 s, per catch-up
                                          fetch_max_wait_ms=100, **self.client_options)
        # independent round trips: overlap them (and the checkpoint load) to keep a restart short
        loaded_task = asyncio.get_running_loop().run_in_executor(None, self.load_checkpoint)
        started = await asyncio.gather(self._ensure_topic(), self._producer.start(), self._consumer.start(),
                                       return_exceptions=True)  # all settled, so close() finds no start half done
        loaded = await loaded_task
        for outcome in started:
            if isinstance(outcome, BaseException):
                raise outcome
        tps = [TopicPartition(self.topic, p) for p in range(self.partitions)]
        self._consumer.assign(tps)
        from_beginning = []
        for tp in tps:
            start = loaded.get(tp.partition, 0)
            self.positions[tp.partition] = start
            if start:
                self._consumer.seek(tp, start)
            else:
                from_beginning.append(tp)
        if from_beginning:  # one reset for all: each call waits for the fetcher's next round (~0.5 s)
            await self._consumer.seek_to_beginning(*from_beginning)
        self._task = asyncio.get_running_loop().create_task(self._consume())
        await self.catch_up()

    async def _ensure_topic(self) -> None:
        from aiokafka.admin import AIOKafkaAdminClient, NewTopic
        from aiokafka.errors import TopicAlreadyExistsError

        admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap, **self.client_options)
        await admin.start()
        try:
            replication = self.replication
            if replication is None:
                meta = await admin.describe_cluster()
                replication = min(3, len(meta["brokers"]))
            topics = [NewTopic(self.topic, self.partitions, replication, topic_configs=self.topic_config)]
            if self.audit_topic:
                topics.append(NewTopic(self.audit_topic, self.partitions, replication,
                                       topic_configs={"retention.ms": "-1"}))
            for t in topics:
                with contextlib.suppress(TopicAlreadyExistsError):
                    resp = await admin.create_topics([t])
                    for _, code, *_ in getattr(resp, "topic_errors", []):
                        if code not in (0, 36):  # 36 TOPIC_ALREADY_EXISTS
                            raise RuntimeError(f"creating {t.name}: error {code}")
            await self._check_topic(admin)
        finally:
            await admin.close()

    async def _check_topic(self, admin: Any) -> None:
        """An existing metadata topic must have the partition count records are hashed into (as Kafka's
        TopicBasedRemoteLogMetadataManager checks) and be compacted: otherwise the view would be partial, or
        the history of every segment would grow without bound. Raises `MetadataTopicMismatch` naming both."""
        from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

        count, error, waited = 0, None, 0.0
        # a topic just created may not have reached every broker's metadata yet: a broker busy creating thousands
        # of partitions took over 10 s to show this one's (the wide-pass bench); waited for up to about a minute
        for attempt in range(TOPIC_VISIBLE_ATTEMPTS):
            described = await admin.describe_topics([self.topic])
            found = [t for t in described if (t.get("topic") or t.get("name")) == self.topic]
            error = found[0].get("error_code") if found else None
            count = len(found[0]["partitions"]) if found else 0
            if count and not error:
                break
            if error == 29:  # TOPIC_AUTHORIZATION_FAILED
                raise MetadataTopicMismatch(f"metadata topic {self.topic}: not authorized to describe it (grant "
                                            "tierproxy's principal DESCRIBE on it: docs/proxy.md 'Secured clusters')")
            pause = min(2.0, 0.25 * 2 ** attempt)
            await asyncio.sleep(pause)
            waited += pause
        if count == 0:
            raise MetadataTopicMismatch(f"metadata topic {self.topic} not visible with its partitions after "
                                        f"{waited:.0f} s (error {error}): the cluster has not finished creating it; "
                                        "start again")
        if count != self.partitions:
            raise MetadataTopicMismatch(f"metadata topic {self.topic} has {count} partitions, configured "
                                        f"{self.partitions} (the metadata URI's partitions=): records would be "
                                        "looked for in the wrong partitions")
        policy: str | None = None
        for _ in range(40):  # a broker that has not learnt of a topic just created answers with an error: again
            for resp in await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, self.topic)]):
                for res in resp.resources:  # (error_code, error_message, resource_type, name, config entries)
                    if res[0] == 0:
                        policy = next((e[1] or "" for e in res[4] if e[0] == "cleanup.policy"), policy)
            if policy is not None:
                break
            await asyncio.sleep(0.25)
        policy = policy or ""
        if "compact" not in policy.split(","):
            raise MetadataTopicMismatch(f"metadata topic {self.topic} has cleanup.policy={policy or '?'}; it must "
                                        "include compact (alter it, or point metadata at another topic)")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self.checkpoint_dir is not None and self.failure is None and self._consumer is not None:
            self.write_checkpoint()
        await self._stop_clients()

    # --- consume -----------------------------------------------------------------------------------------------
    async def _consume(self, backoff_s: float = 1.0, backoff_max_s: float = 30.0) -> None:
        """Apply the metadata topic as it grows. A failing consumer is never left stopped: the failure is kept in
        `failure` (readyz shows it, the proxy answers retriable errors meanwhile), counted, and the consumer
        resumes from its positions after an exponential backoff."""
        from aiokafka import TopicPartition

        delay = backoff_s
        while True:
            try:
                batches = await self._consumer.getmany(timeout_ms=200, max_records=10000)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the cache must not silently stop moving
                self.failure = exc
                self.consumer_restarts += 1
                log.error("remote log metadata consumer failed (%s: %s); restarting in %.0fs",
                          type(exc).__name__, exc, delay)
                async with self._progress:
                    self._progress.notify_all()
                await asyncio.sleep(delay)
                delay = min(backoff_max_s, delay * 2)
                for p, pos in self.positions.items():
                    self._consumer.seek(TopicPartition(self.topic, p), pos)
                continue
            delay = backoff_s
            self.failure = None
            for tp, msgs in batches.items():
                for m in msgs:
                    self._apply(tp.partition, m.offset, m.key, m.value)
                if msgs:
                    self.positions[tp.partition] = msgs[-1].offset + 1
            for tp in self._consumer.assignment():  # past transaction markers and aborted writes too (read_committed)
                pos = await self._consumer.position(tp)
                if pos > self.positions.get(tp.partition, 0):
                    self.positions[tp.partition] = pos
            async with self._progress:
                self._progress.notify_all()

    def _apply(self, partition: int, offset: int, key: bytes | None, value: bytes | None) -> None:
        """Apply one consumed record. A malformed one (another writer, a bad tool) is logged, counted and skipped,
        and kept out of the checkpoint: it must not stop the consumer, which would freeze the cache for good."""
        self.records_consumed += 1
        try:
            self.apply_record(key, value, partition, offset)
        except (IllegalStateTransition, ValueError, ProtocolError) as exc:
            self._records_skipped += 1
            log.error("metadata partition %d offset %d: %s (record skipped)", partition, offset, exc)

    def lag_records(self) -> int:
        """Per metadata partition, its last stable offset as the latest fetch saw it minus the position applied."""
        from aiokafka import TopicPartition

        if self._consumer is None:
            return 0
        lag = 0
        for p, pos in self.positions.items():
            tp = TopicPartition(self.topic, p)
            end = self._consumer.last_stable_offset(tp)
            end = self._consumer.highwater(tp) if end is None else end
            lag += max(0, (end or 0) - pos)
        return lag

    async def _wait(self, targets: dict[int, int]) -> None:
        """Until the view reaches `targets` (metadata partition → offset); TimeoutError once it has not moved for
        `stall_timeout_s`."""
        async def reached() -> None:
            async with self._progress:
                await self._progress.wait_for(
                    lambda: self.failure is not None or all(self.positions.get(p, 0) >= o for p, o in targets.items()))
        while True:
            moved = sum(self.positions.values())
            try:
                await asyncio.wait_for(reached(), self.stall_timeout_s)
                break
            except TimeoutError:
                if sum(self.positions.values()) == moved:
                    behind = sum(max(0, o - self.positions.get(p, 0)) for p, o in targets.items())
                    raise TimeoutError(f"metadata topic {self.topic}: no progress for {self.stall_timeout_s:.0f}s "
                                       f"with {behind} records still to read") from None
        if self.failure is not None:
            raise RuntimeError(f"metadata consumer failed: {self.failure}")

    async def catch_up(self) -> None:
        from aiokafka import TopicPartition

        ends = await self._consumer.end_offsets([TopicPartition(self.topic, p) for p in range(self.partitions)])
        await self._wait({tp.partition: off for tp, off in ends.items()})

    # --- publish -----------------------------------------------------------------------------------------------
    async def publish(self, records: list[tuple[bytes, bytes | None]]) -> None:
        from aiokafka.errors import (
            ClusterAuthorizationFailedError,
            InvalidProducerEpoch,
            ProducerFenced,
            TopicAuthorizationFailedError,
            TransactionalIdAuthorizationFailed,
        )

        try:
            if self.writer_id is None:
                metas = await self._send(records)
            else:
                async with self._producer.transaction():
                    metas = await self._send(records)
        except (ProducerFenced, InvalidProducerEpoch) as exc:
            raise WriterFenced(f"another tier job took over {self.topic} (transactional id {self.writer_id}): "
                               f"{exc}") from exc
        except (TopicAuthorizationFailedError, ClusterAuthorizationFailedError,
                TransactionalIdAuthorizationFailed) as exc:
            raise MetadataWriteRefused(f"metadata topic {self.topic}: the write was refused: {exc}") from exc
        targets: dict[int, int] = {}
        for md in metas:
            targets[md.partition] = max(targets.get(md.partition, 0), md.offset + 1)
        await self._wait(targets)

    async def _send(self, records: list[tuple[bytes, bytes | None]]) -> list[Any]:
        futures = []
        for key, value in records:
            partition = self._partition_for(key, value)
            futures.append(await self._producer.send(self.topic, value=value, key=key, partition=partition))
            if self.audit_topic and value is not None:
                await self._producer.send(self.audit_topic, value=value, key=key, partition=partition)
        return list(await asyncio.gather(*futures))

    def _partition_for(self, key: bytes, value: bytes | None) -> int:
        if value is not None:
            event = decode_value(value)
            if isinstance(event, (TierPass, TopicMount)):
                return 0  # not a partition's: the first metadata partition
            tp = event.segment_id.tp if isinstance(event, RemoteLogSegmentMetadataUpdate) else event.tp
            return metadata_partition(tp, self.partitions)
        live = self.values.get(key)  # a tombstone goes where its key lives
        if live is None:
            raise ValueError(f"tombstone for unknown key {key!r}")
        return self._partition_for(key, live)

    # --- checkpoint --------------------------------------------------------------------------------------------
    def _checkpoint_path(self) -> Path:
        assert self.checkpoint_dir is not None
        return self.checkpoint_dir / f"{self.topic}.checkpoint"

    def write_checkpoint(self) -> None:
        """Write the consumed offset of every metadata partition and every live record, in the order applied
        (atomically). Each key lives in one metadata partition, so replaying them in that order gives this view."""
        if self.checkpoint_dir is None:
            return
        # (deferred records are written as they are, not applied first: one that fails when applied is skipped
        # again when the next start applies it, and the view is the same; applying a million would hold a stop)
        self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        w = Writer()
        w.unsigned_varint(CHECKPOINT_MAGIC)
        w.unsigned_varint(len(self.positions))
        for p, offset in sorted(self.positions.items()):
            w.unsigned_varint(p)
            w.varlong(offset)
        for key, value in self.values.items():
            w.unsigned_varint(len(key))
            w.raw(key)
            w.unsigned_varint(len(value))
            w.raw(value)
        path = self._checkpoint_path()
        tmp = path.with_suffix(".tmp")
        with tmp.open("wb") as out:
            out.writelines(buffers(w.finish()))
        os.replace(tmp, path)
        for old in self.checkpoint_dir.glob(f"{glob.escape(self.topic)}-*.checkpoint"):  # the format before 2
            old.unlink(missing_ok=True)

    def load_checkpoint(self) -> dict[int, int]:
        """Load the checkpoint into the view; return the offsets to resume from (none: read the topic whole)."""
        if self.checkpoint_dir is None:
            return {}
        path = self._checkpoint_path()
        if not path.exists():
            return {}
        r = Reader(memoryview(path.read_bytes()))
        try:
            if r.unsigned_varint() != CHECKPOINT_MAGIC:
                log.warning("ignoring checkpoint %s: unknown format", path)
                return {}
            offsets = {r.unsigned_varint(): r.varlong() for _ in range(r.unsigned_varint())}
            entries = []
            while r.remaining():
                key = bytes(r.view(r.unsigned_varint()))
                entries.append((key, bytes(r.view(r.unsigned_varint()))))
        except ProtocolError as exc:
            log.warning("ignoring checkpoint %s: %s", path, exc)
            return {}
        cache = self.cache  # (the one loaded into, whatever replaces `cache` meanwhile: a cancelled start)
        cache.loader = threading.get_ident()  # (run on a worker thread: `MetadataCache.loader`)
        try:
            for key, value in entries:
                try:
                    self.apply_record(key, value, CHECKPOINT)
                except (IllegalStateTransition, ValueError, ProtocolError) as exc:
                    log.error("checkpoint %s: %s (entry skipped)", path, exc)
        finally:
            cache.loader = None
        return offsets
        for p in range(self.partitions):
            path = self._checkpoint_path(p)
            if not path.exists():
                continue
            r = Reader(memoryview(path.read_bytes()))
            if r.unsigned_varint() != CHECKPOINT_MAGIC:
                log.warning("ignoring checkpoint %s: unknown format", path)
                continue
            offsets[p] = r.varlong()
            latest = self.latest.setdefault(p, {})
            n = 0
            while r.remaining():
                length = r.unsigned_varint()
                er = Reader(r.view(length))
                key = bytes(er.view(er.unsigned_varint()))
                value = bytes(er.view(er.remaining()))
                latest[key] = (n - (1 << 40), value)  # before every offset consumed after the checkpoint
                n += 1
                try:
                    self.apply_record(key, value)
                except (IllegalStateTransition, ValueError, ProtocolError) as exc:
                    log.error("checkpoint %s: %s (entry skipped)", path, exc)
        return offsets
