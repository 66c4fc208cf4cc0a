"""The table's lifecycle against a real broker: kill -9 of the step at its points then a rerun (the table
equals the tier, no file twice, no orphan left), and the table following the tier (tier retention, a DeleteRecords
purge mid-segment, a deleted topic) unless `--retention keep`."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient

from tests.fleet.conftest import replica
from tests.support.cli import run_cli
from tests.support.iceberg import Step, pyiceberg_rows, reads_whole, referenced, tier_offsets, unreferenced
from tests.support.kafka import create_topic, delete_records, fill_topic
from tests.support.tiering import settings, tier_once, tiered
from tierproxy.dev.kafkadist import KafkaCluster
from tierproxy.jobs.iceberg.manifests import data_manifests

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


def test_kill_9_at_each_point_then_a_rerun_leaves_the_table_as_if_never_killed(kafka: KafkaCluster,
                                                                             tmp_path: Path) -> None:
    """Slow (~75 s): four passes run as processes of their own (a JVM each) to be killed -9, then a rerun."""
    topic = f"ice-kill-{os.getpid()}"
    create_topic(kafka.bootstrap, topic)
    fill_topic(kafka.bootstrap, topic, 2000)
    s = settings(kafka.bootstrap, tmp_path, topic)
    assert tier_once(s).segments >= 3
    step = Step(kafka.bootstrap, tmp_path, topic)

    step.killed_at("files")  # data files written, nothing committed
    assert step.data_files_on_disk(), "the killed pass wrote its files"
    assert step.table().current_snapshot() is None or referenced(step.table()) == []

    step.killed_at("cleanup")  # committed, then killed while deleting the first pass's orphans
    committed = referenced(step.table())
    assert committed and len(committed) == len(set(committed))
    assert [r[4] for r in pyiceberg_rows(step.table())] == tier_offsets(s, topic)

    fill_topic(kafka.bootstrap, topic, 1000)  # more history, tiered, then a kill right after its commit
    assert tier_once(s).segments >= 1
    step.killed_at("commit")
    after_commit = referenced(step.table())
    assert len(after_commit) > len(committed)

    # killed during maintenance (`test_maintenance` has its rules): a short time travel and manifests merged from
    # two; its expiry committed, its merged manifests written, not committed
    with step.table().transaction() as tx:
        tx.set_properties({"history.expire.max-snapshot-age-ms": "1", "history.expire.min-snapshots-to-keep": "2",
                           "commit.manifest.min-count-to-merge": "2"})
    step.killed_at("maintenance")
    table = step.table()
    assert len(table.metadata.snapshots) == 2 and data_manifests(table) >= 2, "expired, not merged"
    killed = {p for p in unreferenced(table) if p.endswith(".avro")}
    assert killed, "the killed pass's merged manifest and manifest list"
    reads_whole(table)

    out = step.run()  # the rerun: nothing to add, manifests merged, orphans of the killed passes removed
    assert " 0 files, 0 rows added" in out and "manifests merged" in out, out
    final = step.table()
    assert data_manifests(final) == 1
    reads_whole(final)  # every snapshot kept reads whole, every file the table refers to is there
    assert not killed & unreferenced(final), "the killed pass's manifests are gone"
    files = referenced(final)
    assert sorted(files) == sorted(after_commit) and len(files) == len(set(files))
    assert [r[4] for r in pyiceberg_rows(final)] == tier_offsets(s, topic) == list(range(3000))
    assert step.data_files_on_disk() == set(files), "files no snapshot references are gone"


def test_the_table_follows_tier_retention_purges_and_topic_deletion_unless_kept(kafka: KafkaCluster,
                                                                                  tmp_path: Path) -> None:
    topic = f"ice-follow-{os.getpid()}"
    create_topic(kafka.bootstrap, topic)
    fill_topic(kafka.bootstrap, topic, 3000)
    s = settings(kafka.bootstrap, tmp_path, topic)
    assert tier_once(s).segments >= 6
    step = Step(kafka.bootstrap, tmp_path, topic)
    step.run()
    step.run("--table", "kafka.kept", "--retention", "keep")
    assert [r[4] for r in pyiceberg_rows(step.table())] == list(range(3000))

    # tier retention deletes the two oldest segments (once the broker no longer holds them): their files leave the
    # table in the next pass
    segments = tiered(s, topic)[0]
    assert segments[-1].end_offset == 2999
    assert delete_records(kafka.bootstrap, topic, {0: 3000}) == {0: (0, 3000)}  # the broker's own, not a purge
    keep_bytes = sum(md.segment_size_in_bytes for md in segments[2:])
    run = tier_once(settings(kafka.bootstrap, tmp_path, topic, tier_retention_bytes=keep_bytes,
                             confirm_retention=True))
    assert run.expired == 2
    first = segments[2].start_offset
    files_before = set(referenced(step.table()))
    step.run()
    step.run("--table", "kafka.kept", "--retention", "keep")
    assert [r[4] for r in pyiceberg_rows(step.table())] == list(range(first, 3000))
    dropped = files_before - set(referenced(step.table()))
    assert len(dropped) == 2 and not dropped & step.data_files_on_disk(), "their files are deleted for good"
    assert [r[4] for r in pyiceberg_rows(step.table("kafka.kept"))] == list(range(3000))

    # a purge (DeleteRecords through tierproxy) at an offset inside a segment: no row below it
    cut = (segments[3].start_offset + segments[3].end_offset) // 2
    proxy = replica(kafka.bootstrap, tmp_path, step.storage, step.metadata)
    try:
        assert delete_records(proxy.bootstrap, topic, {0: cut}) == {0: (0, cut)}
    finally:
        proxy.stop()
    step.run()
    step.run("--table", "kafka.kept", "--retention", "keep")
    assert [r[4] for r in pyiceberg_rows(step.table())] == list(range(cut, 3000))
    assert [r[4] for r in pyiceberg_rows(step.table("kafka.kept"))] == list(range(3000))

    # the topic deleted: the tier deletes its partitions, then its rows leave the table
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    admin.delete_topics([topic])[topic].result(30)
    deadline = time.monotonic() + 30  # the controller has it; the broker's metadata follows a moment later, and
    while topic in admin.list_topics(timeout=10).topics:  # a pass that still sees the topic rightly keeps it
        assert time.monotonic() < deadline, f"{topic} still listed 30 s after its deletion"
        time.sleep(0.1)
    assert tier_once(settings(kafka.bootstrap, tmp_path, topic, tier_topic_delete_delay_ms=0,
                              confirm_retention=True)).partitions_deleted == 1
    step.run()
    step.run("--table", "kafka.kept", "--retention", "keep")
    assert pyiceberg_rows(step.table()) == []
    assert step.data_files_on_disk() == set()
    assert len(pyiceberg_rows(step.table("kafka.kept"))) == 3000


def test_snapshot_at_names_the_first_snapshot_holding_the_offsets(kafka: KafkaCluster, tmp_path: Path) -> None:
    import json

    topic = f"ice-at-{os.getpid()}"
    create_topic(kafka.bootstrap, topic)
    s = settings(kafka.bootstrap, tmp_path, topic)
    step = Step(kafka.bootstrap, tmp_path, topic)
    ends = []
    for _ in range(2):
        fill_topic(kafka.bootstrap, topic, 1000)
        tier_once(s)
        step.run()
        ends.append(tiered(s, topic)[0][-1].end_offset + 1)
    table = step.table()
    # the passes' data commits (each pass also made an empty snapshot taking its lease: no `tierproxy.pass`)
    first, second = [snap.snapshot_id for snap in table.snapshots()
                     if "tierproxy.pass" in snap.summary.additional_properties][-2:]

    def at(offset: int) -> dict[str, Any]:
        proc = run_cli("iceberg", "snapshot-at", "--bootstrap-server", step.bootstrap, "--storage", step.storage,
                       "--topic", topic, "--offsets", json.dumps({"0": offset}), cwd=tmp_path, env=step.env())
        assert proc.returncode in (0, 1), proc.stderr[-2000:]
        found: dict[str, Any] = json.loads(proc.stdout)
        return found

    assert at(500)["snapshot_id"] == first
    assert at(ends[0])["snapshot_id"] == first
    later = at(ends[0] + 1)
    assert later["snapshot_id"] == second and later["ends"] == {"0": ends[1]}
    assert at(ends[1] + 1)["snapshot_id"] is None  # nothing holds it yet
    # reading the named snapshot below the offsets gives exactly the records below them
    rows = pyiceberg_rows(table, snapshot_id=first, row_filter=at(700)["filter"])
    assert [r[4] for r in rows] == list(range(700))
    assert [r[4] for r in pyiceberg_rows(table, snapshot_id=first)] == list(range(ends[0]))


def test_200_small_segments_are_compacted_into_one_file_with_the_same_rows(kafka: KafkaCluster,
                                                                          tmp_path: Path) -> None:
    """Slow (~45-70 s): 200 segments become 200 files, then one compaction (a Spark task per segment)."""
    from confluent_kafka import Producer

    topic = f"ice-compact-{os.getpid()}"
    create_topic(kafka.bootstrap, topic)
    p = Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 0, "batch.size": 1024})
    for i in range(3600):  # batches of a few records: tier segments of 4 KiB are cut between them
        p.produce(topic, os.urandom(200), f"k{i}".encode())
        if i % 4 == 3:
            p.flush(30)
    assert p.flush(30) == 0
    s = settings(kafka.bootstrap, tmp_path, topic, tier_segment_bytes=4096)
    assert tier_once(s).segments >= 200
    step = Step(kafka.bootstrap, tmp_path, topic)
    first = step.run(TIERPROXY_ICEBERG_TARGET_FILE_BYTES="0")  # compaction off: a file per segment
    files = referenced(step.table())
    assert len(files) >= 200 and "compacted" not in first
    rows = pyiceberg_rows(step.table())
    assert [r[4] for r in rows] == tier_offsets(s, topic)

    default = {"TIERPROXY_ICEBERG_TARGET_FILE_BYTES": str(128 << 20)}  # the default target
    step.killed_at("compaction", **default)  # merged, not committed: the table as it was, the lease left behind
    assert sorted(referenced(step.table())) == sorted(files) and pyiceberg_rows(step.table()) == rows
    orphan = step.data_files_on_disk() - set(files)
    assert len(orphan) == 1 and "-compacted-" in orphan.pop()

    out = step.run(**default)  # every small file of the partition merged into one; the killed pass's orphan gone
    assert f"{len(files)} files compacted into 1;" in out, out
    table = step.table()
    (only,) = referenced(table)
    assert "-compacted-" in only
    assert pyiceberg_rows(table) == rows  # the same rows, in the same (offset) order
    summary = table.current_snapshot().summary.additional_properties
    assert summary["tierproxy.compaction"] and summary["tierproxy.ends"] == json.dumps(
        {k: v for k, v in json.loads(table.properties["tierproxy.ledger"])["ends"].items()}, sort_keys=True)
    # the replaced files stay while the older snapshots reference them, and are not orphans
    assert step.data_files_on_disk() == set(files) | {only}

    snap = table.current_snapshot().snapshot_id
    assert "compacted" not in step.run(**default)  # a rerun has nothing to add or merge
    assert step.table().current_snapshot().snapshot_id == snap



DAY_MS = 86_400_000


def test_partitioned_by_day_each_file_holds_one_day_and_a_day_filter_reads_only_its_files(kafka: KafkaCluster,
                                                                                          tmp_path: Path) -> None:
    import pyarrow.parquet as pq
    from confluent_kafka import Producer

    topic = f"ice-days-{os.getpid()}"
    create_topic(kafka.bootstrap, topic, partitions=2)
    first_day = int(time.time() * 1000) // DAY_MS - 4  # four days ago: inside the broker's 7-day retention
    # small batches make small tier segments; idempotence keeps a retried batch in order (offset = n below)
    p = Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 5, "batch.size": 4096, "enable.idempotence": True})
    day_of: dict[tuple[int, int], int] = {}
    for i in range(1200):
        part, n = i % 2, i // 2
        day = first_day + n // 200 if n % 50 != 49 else first_day  # every 50th one late: a day-0 timestamp
        p.produce(topic, os.urandom(100), partition=part, timestamp=day * DAY_MS + n * 1000)
        day_of[(part, n)] = day
    assert p.flush(30) == 0
    s = settings(kafka.bootstrap, tmp_path, topic, tier_segment_bytes=16 * 1024)
    assert tier_once(s).segments >= 6  # segments spanning days, and late records in most of them
    step = Step(kafka.bootstrap, tmp_path, topic)
    step.run(TIERPROXY_ICEBERG_PARTITION_BY="partition,day(timestamp)")
    table = step.table()
    assert [f.name for f in table.spec().fields] == ["topic", "partition", "timestamp_day"]

    def check(table: Any) -> list[Any]:
        tasks = list(table.scan().plan_files())
        for task in tasks:  # each file: one Kafka partition and one day, its rows in offset order
            _, part, day = (task.file.partition[i] for i in range(3))
            rows = pq.read_table(task.file.file_path.removeprefix("file://"))
            offsets = rows.column("offset").to_pylist()
            assert set(rows.column("partition").to_pylist()) == {part} and offsets == sorted(offsets)
            assert {day_of[(part, o)] for o in offsets} == {day}, task.file.file_path
        got = table.scan().to_arrow()
        seen = sorted(zip(got.column("partition").to_pylist(), got.column("offset").to_pylist(), strict=True))
        assert seen == sorted(day_of)  # every record once
        for part, off, ts in zip(got.column("partition").to_pylist(), got.column("offset").to_pylist(),
                                 got.column("timestamp").to_pylist(), strict=True):
            assert int(ts.timestamp() * 1000) // DAY_MS == day_of[(part, off)]
        days = {(t.file.partition[1], t.file.partition[2]) for t in tasks}
        assert days == {(part, d) for (part, _), d in day_of.items()}
        # a filter on one day plans only that day's files
        lo = f"{time.strftime('%Y-%m-%dT%H:%M:%S+00:00', time.gmtime((first_day + 1) * DAY_MS / 1000))}"
        hi = f"{time.strftime('%Y-%m-%dT%H:%M:%S+00:00', time.gmtime((first_day + 2) * DAY_MS / 1000))}"
        one_day = list(table.scan(row_filter=f"timestamp >= '{lo}' AND timestamp < '{hi}'").plan_files())
        assert one_day and {t.file.partition[2] for t in one_day} == {first_day + 1}
        return tasks

    tasks = check(table)
    assert len(tasks) >= 6  # 2 partitions, 3 days each at least; a segment spanning days is split by day
    before = sorted(table.scan().to_arrow().column("offset").to_pylist())

    # compaction merges within a day, never across: each file still one partition and one day
    out = step.run(TIERPROXY_ICEBERG_PARTITION_BY="partition,day(timestamp)",
                   TIERPROXY_ICEBERG_TARGET_FILE_BYTES=str(128 << 20), TIERPROXY_ICEBERG_COMPACTION_MIN_INPUT_FILES="2")
    table = step.table()
    compacted = check(table)
    assert "compacted into" in out and len(compacted) < len(tasks)
    assert sorted(table.scan().to_arrow().column("offset").to_pylist()) == before


def test_the_admin_api_metrics_and_cli_show_the_tables_lag(kafka: KafkaCluster, tmp_path: Path) -> None:
    import httpx

    from tests.support.waiting import wait_until
    from tierproxy.dev.ports import free_port

    topic = f"ice-admin-{os.getpid()}"
    create_topic(kafka.bootstrap, topic)
    fill_topic(kafka.bootstrap, topic, 1000)
    s = settings(kafka.bootstrap, tmp_path, topic)
    step = Step(kafka.bootstrap, tmp_path, topic)
    # `tier` with iceberg.catalog set: the Iceberg pass follows the tier pass in the same Spark session
    tiering = run_cli("tier", "--once", "--no-progress", "--bootstrap-server", kafka.bootstrap, "--storage",
                      step.storage, "--metadata", step.metadata, "--topics", re.escape(topic), "--master", "local[2]",
                      cwd=tmp_path, env={**step.env(), "TIERPROXY_ICEBERG_CATALOG": "embedded",
                                         "TIERPROXY_TIER_SEGMENT_BYTES": str(64 * 1024)})
    assert tiering.returncode == 0, tiering.stderr[-3000:]
    assert "tiered " in tiering.stdout and "iceberg pass" in tiering.stdout, tiering.stdout
    admin = f"127.0.0.1:{free_port()}"
    proxy = replica(kafka.bootstrap, tmp_path, step.storage, step.metadata, TIERPROXY_ICEBERG_CATALOG="embedded",
                    TIERPROXY_ADMIN_LISTEN=admin)
    try:
        url = f"http://{admin}"
        st = wait_until(lambda: (r := httpx.get(f"{url}/v1/iceberg", timeout=30)).status_code == 200 and r.json(),
                        timeout=60, interval=0.5, what="the admin API's iceberg status")
        assert st["exists"] and st["rows"] == 1000 and st["lag_offsets"] == 0, st
        assert st["partitions"] == [{"topic": topic, "partition": 0, "tier_end": 1000, "table_end": 1000, "lag": 0}]
        metrics = httpx.get(f"{url}/metrics", timeout=30).text
        assert "tierproxy_iceberg_rows 1000.0" in metrics and f'tierproxy_iceberg_lag_offsets{{topic="{topic}"}} 0.0' \
            in metrics
        # what maintenance bounds: live bytes, bytes on disk, snapshots, manifests (`manifests.figures`)
        assert st["snapshots"] >= 2 and st["manifests"] >= 1 and 0 < st["live_bytes"] <= st["disk_bytes"], st
        assert f"tierproxy_iceberg_snapshots {float(st['snapshots'])}" in metrics and \
            f"tierproxy_iceberg_disk_bytes {float(st['disk_bytes'])}" in metrics

        fill_topic(kafka.bootstrap, topic, 500)  # tiered, not yet in the table: the replica shows the lag
        tier_once(s)
        tier_end = tiered(s, topic)[0][-1].end_offset + 1
        assert tier_end > 1000
        # the replica reads the metadata topic's records as they come: it may see some of the new segments first
        st = wait_until(lambda: (x := httpx.get(f"{url}/v1/iceberg", timeout=30).json())["lag_offsets"]
                        == tier_end - 1000 and x, timeout=60, interval=0.5, what="the replica to see all new segments")
        assert st["partitions"][0]["lag"] == tier_end - 1000 and st["partitions"][0]["tier_end"] == tier_end, st
        out = run_cli("admin", "--url", url, "iceberg", env={"COLUMNS": "200"})
        assert out.returncode == 0 and "kafka.history" in out.stdout and str(tier_end - 1000) in out.stdout, out
    finally:
        proxy.stop()


def test_a_recreated_topics_old_rows_stay_until_the_tier_deletes_the_old_incarnation(kafka: KafkaCluster,
                                                                                      tmp_path: Path) -> None:
    """A topic tabled, then deleted and created again (a rebuilt cluster): its old rows stay while the tier holds
    the old incarnation's partitions (tier.topic.delete.delay.ms), and the new incarnation's rows wait for them
    (rows are named by topic, partition and offset: the two would collide); once the tier has deleted the old id
    (delay 0, deletion confirmed), the old rows go and the new ones come, in one commit. Before: the first pass
    after the re-creation deleted every old row and expired the snapshots that held them.

    Under `--retention keep` (issue 67, item 2) the table keeps both incarnations under the same (topic, partition,
    offset): each row's `topicId` says which, the table records both ids, and `snapshot-at` chooses by id (the
    current incarnation unless `--topic-id` names another). Before: nothing in a row told them apart and
    `snapshot-at`'s filter read both incarnations' rows."""
    topic = f"ice-recreated-{os.getpid()}"
    create_topic(kafka.bootstrap, topic)
    fill_topic(kafka.bootstrap, topic, 2000)
    s = settings(kafka.bootstrap, tmp_path, topic)
    assert tier_once(s).segments >= 3
    step = Step(kafka.bootstrap, tmp_path, topic)
    kept = ("--table", "kafka.kept", "--retention", "keep")
    # and a kept upsert table of the topic (its values as bytes: the latest value per key)
    upsert = {"TIERPROXY_ICEBERG_TABLES": f"{re.escape(topic)}=kv.kept", "TIERPROXY_ICEBERG_VALUE_FORMAT": "bytes",
              "TIERPROXY_ICEBERG_MODE": "upsert"}
    step.run()
    step.run(*kept, **upsert)
    old = pyiceberg_rows(step.table())
    assert [r[4] for r in old] == tier_offsets(s, topic)
    old_id = json.loads(step.table().properties["tierproxy.ledger"])["topics"][topic]

    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    admin.delete_topics([topic])[topic].result(30)
    deadline = time.monotonic() + 60
    while True:
        try:
            create_topic(kafka.bootstrap, topic)
            break
        except Exception:  # the deletion is still under way
            assert time.monotonic() < deadline, "the topic was never created again"
            time.sleep(0.5)
    fill_topic(kafka.bootstrap, topic, 500)
    delayed = settings(kafka.bootstrap, tmp_path, topic, tier_topic_delete_delay_ms=3_600_000)
    assert tier_once(delayed).partitions_deleted == 0  # proven gone, kept for the delay
    out = step.run()
    assert pyiceberg_rows(step.table()) == old, "the old incarnation's rows must stay while the tier holds it"
    assert " 0 rows removed" in out, out

    assert tier_once(settings(kafka.bootstrap, tmp_path, topic, tier_topic_delete_delay_ms=0,
                              confirm_retention=True)).partitions_deleted == 1
    step.run()
    step.run(*kept, **upsert)
    new = [r[4] for r in pyiceberg_rows(step.table())]
    assert new == tier_offsets(s, topic) == list(range(500))  # the new incarnation's records only
    new_id = json.loads(step.table().properties["tierproxy.ledger"])["topics"][topic]
    assert new_id != old_id
    assert set(step.table().scan().to_arrow().column("topicId").to_pylist()) == {new_id}

    # kept: both incarnations, told apart by their id; the table records the ids it holds
    rows = step.table("kafka.kept").scan(selected_fields=("topicId", "offset")).to_arrow().to_pylist()
    by_id: dict[str, list[int]] = {}
    for r in rows:
        by_id.setdefault(r["topicId"], []).append(r["offset"])
    assert {k: sorted(v) for k, v in by_id.items()} == {old_id: [r[4] for r in old], new_id: list(range(500))}
    ledger = json.loads(step.table("kafka.kept").properties["tierproxy.ledger"])
    assert ledger["ids"] == {old_id: topic, new_id: topic}
    # upsert: the latest value per key within each incarnation (the new one's k0..k499 at offsets 0..499 do not
    # compete with the old one's k0..k1999: before, one of the two rows of each such key was deleted)
    kv = step.table("kv.kept").scan(selected_fields=("_kafka_topic_id", "_kafka_key")).to_arrow().to_pylist()
    per_id: dict[str, set[bytes]] = {}
    for r in kv:
        per_id.setdefault(r["_kafka_topic_id"], set()).add(r["_kafka_key"])
    assert len(kv) == len(old) + 500
    assert per_id == {old_id: {f"k{r[4]}".encode() for r in old},
                      new_id: {f"k{i}".encode() for i in range(500)}}

    def at(*extra: str) -> dict[str, Any]:
        proc = run_cli("iceberg", "snapshot-at", "--storage", step.storage, "--table", "kafka.kept", "--topic", topic,
                       "--offsets", json.dumps({"0": 300}), *extra, cwd=tmp_path, env=step.env())
        assert proc.returncode == 0, proc.stderr[-2000:]
        found: dict[str, Any] = json.loads(proc.stdout)
        return found

    table = step.table("kafka.kept")
    for wanted, extra in ((new_id, ()), (new_id, ("--topic-id", new_id)), (old_id, ("--topic-id", old_id))):
        found = at(*extra)
        assert found["topic_id"] == wanted, found
        got = table.scan(snapshot_id=found["snapshot_id"], row_filter=found["filter"]).to_arrow()
        assert sorted(got.column("offset").to_pylist()) == list(range(300)), (wanted, found)
        assert set(got.column("topicId").to_pylist()) == {wanted}
