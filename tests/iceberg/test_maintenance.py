"""Table maintenance on a real table (pyiceberg's SQL catalog on SQLite, files on disk), time from a clock passed in:
snapshots expired by the table's history.expire.* properties with Iceberg's defaults, never main's head, the
snapshot carrying the ledger, nor while another pass holds a live lease; manifests merged at the table's bound;
files nothing live refers to removed behind a fence, never one a live snapshot or a later pass refers to."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from tierproxy.jobs.iceberg.cleanup import Cleanup
from tierproxy.jobs.iceberg.ledger import ENDS, WRITER, Ledger, current_ledger
from tierproxy.jobs.iceberg.maintenance import DAY_MS, BadTableProperty, Retention, plan_expiry
from tierproxy.jobs.iceberg.manifests import data_manifests, figures
from tierproxy.jobs.iceberg.orphans import referenced
from tierproxy.jobs.iceberg.writer import Lease

HOUR_MS = 3_600_000


@dataclass
class Target:  # what a pass's `sync._Target` gives the cleanup step
    table: Any
    name: str = "ns.t"
    at: int | None = None
    fence_ms: int | None = None


def _table(tmp: Path) -> Any:
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("t", uri=f"sqlite:///{tmp}/catalog.db", warehouse=f"file://{tmp}/warehouse")
    catalog.create_namespace("ns")
    return catalog.create_table("ns.t", pa.schema([pa.field("n", pa.int64())]))


def _append(table: Any, first: int, ledger: bool = False) -> Any:
    props = Ledger({"id:0": first + 10}).summary("p", []) if ledger else {}
    table.append(pa.table({"n": pa.array(range(first, first + 10), pa.int64())}), snapshot_properties=props)
    return table.refresh()


def _reads_whole(table: Any) -> None:
    """Every snapshot the table keeps reads every row its summary counts (no file it needs is gone)."""
    for snap in table.metadata.snapshots:
        rows = table.scan(snapshot_id=snap.snapshot_id).to_arrow().num_rows
        assert rows == int(snap.summary.additional_properties["total-records"]), snap


def _clock(ms: int) -> Any:
    return lambda: ms / 1000


def test_snapshots_expire_by_age_and_count_never_main_the_ledgers_nor_under_a_live_lease(tmp_path: Path) -> None:
    table = _table(tmp_path)
    for i in range(6):  # passes' commits (the ledger in their summaries: a table from before its property), then
        table = _append(table, i * 10, ledger=i < 4)  # another writer's two appends, no ledger in theirs
    ids = [s.snapshot_id for s in table.metadata.snapshots]
    last = table.current_snapshot().timestamp_ms
    t = Target(table)

    assert Cleanup(30_000, 0, _clock(last + HOUR_MS)).maintain(t, "a").snapshots_expired == 0  # 5 days by default
    # past the age: the table's minimum (4) of main's newest stay
    with t.table.transaction() as tx:
        tx.set_properties({"history.expire.min-snapshots-to-keep": "4"})
    t.table = t.table.refresh()
    later = Cleanup(30_000, 0, _clock(last + 6 * DAY_MS))
    assert later.maintain(t, "b").snapshots_expired == 2
    assert [s.snapshot_id for s in t.table.metadata.snapshots] == ids[2:]
    _reads_whole(t.table)

    # a live lease of another pass (its process alive): nothing is expired while it writes
    with t.table.transaction() as tx:
        tx.set_properties({"history.expire.min-snapshots-to-keep": "1", WRITER: Lease.new("other").value()})
    t.table = t.table.refresh()
    assert later.maintain(t, "c").snapshots_expired == 0 and len(t.table.metadata.snapshots) == 4
    with t.table.transaction() as tx:
        tx.remove_properties(WRITER)
    t.table = t.table.refresh()
    # minimum 1, yet main's ancestry down to the ledger's snapshot stays: the ledger is read from there
    assert later.maintain(t, "d").snapshots_expired == 1
    assert [s.snapshot_id for s in t.table.metadata.snapshots] == ids[3:]
    assert current_ledger(t.table).ends == {"id:0": 40}
    _reads_whole(t.table)


def test_tags_are_kept_until_their_max_ref_age_and_bad_properties_are_named(tmp_path: Path) -> None:
    table = _table(tmp_path)
    for i in range(3):
        table = _append(table, i * 10, ledger=True)
    first, *_, head = table.metadata.snapshots
    table.manage_snapshots().create_tag(first.snapshot_id, "audit").commit()
    table = table.refresh()
    now = head.timestamp_ms + 6 * DAY_MS
    plan = plan_expiry(table.metadata, now, Retention.of(table.properties, "ns.t"), {head.snapshot_id})
    assert plan.refs == [] and first.snapshot_id not in plan.snapshots and len(plan.snapshots) == 1
    older = Retention.of({"history.expire.max-ref-age-ms": str(DAY_MS)}, "ns.t")
    plan = plan_expiry(table.metadata, now, older, {head.snapshot_id})
    assert plan.refs == ["audit"] and sorted(plan.snapshots) == sorted(
        s.snapshot_id for s in table.metadata.snapshots if s.snapshot_id != head.snapshot_id)
    t = Target(table)
    with t.table.transaction() as tx:
        tx.set_properties({"history.expire.max-ref-age-ms": str(DAY_MS)})
    t.table = t.table.refresh()
    assert Cleanup(30_000, 0, _clock(now)).maintain(t, "a").snapshots_expired == 2
    assert "audit" not in t.table.metadata.refs and len(t.table.metadata.snapshots) == 1

    for key, value in (("history.expire.min-snapshots-to-keep", "0"), ("history.expire.max-snapshot-age-ms", "5d"),
                       ("commit.manifest-merge.enabled", "yes"), ("commit.manifest.min-count-to-merge", "²")):
        with pytest.raises(BadTableProperty, match=f"table ns.t: property {key}='{value}'"):
            Retention.of({key: value}, "ns.t")


def test_manifests_are_merged_at_the_tables_bound_and_every_snapshot_still_reads(tmp_path: Path) -> None:
    table = _table(tmp_path)
    for i in range(6):
        table = _append(table, i * 10, ledger=True)
    assert data_manifests(table) == 6
    t = Target(table)
    clock = _clock(table.current_snapshot().timestamp_ms)
    assert Cleanup(30_000, 0, clock).maintain(t, "a").manifests_merged == 0  # below Iceberg's default bound (100)
    with t.table.transaction() as tx:
        tx.set_properties({"commit.manifest.min-count-to-merge": "6"})
    t.table = t.table.refresh()
    rows = sorted(t.table.scan().to_arrow()["n"].to_pylist())
    done = Cleanup(30_000, 0, clock).maintain(t, "b")
    assert done.manifests_merged == 6 and data_manifests(t.table) == 1
    snap = t.table.current_snapshot()
    assert snap.summary.additional_properties["tierproxy.maintenance"] == "b"
    assert json.loads(snap.summary.additional_properties[ENDS]) == {"id:0": 60}  # the ledger carried unchanged
    assert t.at == snap.snapshot_id and t.fence_ms == snap.timestamp_ms  # a commit of this pass: its fence
    assert sorted(t.table.scan().to_arrow()["n"].to_pylist()) == rows == list(range(60))
    _reads_whole(t.table)
    assert Cleanup(30_000, 0, clock).maintain(t, "c").manifests_merged == 0  # one manifest now


def test_orphans_go_behind_a_fence_never_a_live_snapshots_file_nor_a_later_passs(tmp_path: Path) -> None:
    table = _table(tmp_path)
    for i in range(4):
        table = _append(table, i * 10, ledger=True)
    with table.transaction() as tx:
        tx.set_properties({"history.expire.max-snapshot-age-ms": "1"})
    t = Target(table.refresh())
    now = t.table.current_snapshot().timestamp_ms + 1000
    cleanup = Cleanup(30_000, 0, _clock(now))
    before = set(referenced(t.table))
    assert cleanup.maintain(t, "a").snapshots_expired == 3
    location = Path(t.table.location().removeprefix("file://"))
    killed = location / "data" / "killed-pass.parquet"  # a killed pass's data file and manifest
    killed.write_bytes(b"x")
    stray_manifest = location / "metadata" / "killed-m0.avro"
    stray_manifest.write_bytes(b"x")
    hour_ago = now / 1000 - 3600
    for p in (killed, stray_manifest):
        os.utime(p, (hour_ago, hour_ago))
    later = location / "data" / "planned-after-the-fence.parquet"  # another pass's, written after this one's commit
    later.write_bytes(b"x")

    live = referenced(t.table.refresh())
    gone_manifest_lists = {p for p in before - live if p.endswith(".avro")}
    assert gone_manifest_lists, "the expired snapshots' manifest lists are orphans now"
    t.fence_ms = int(later.stat().st_mtime * 1000)  # as if this pass had committed just before `later` was written
    with t.table.transaction() as tx:  # a live lease: nothing goes
        tx.set_properties({WRITER: Lease.new("other").value()})
    assert Cleanup(30_000, 0, _clock(now)).clean_orphans(t, "a") == 0 and killed.exists()
    with t.table.refresh().transaction() as tx:
        tx.remove_properties(WRITER)
    t.fence_ms = int(later.stat().st_mtime * 1000)  # (the commits above moved no snapshot)
    deleted = Cleanup(30_000, 0, _clock(now)).clean_orphans(t, "a")
    assert not killed.exists() and not stray_manifest.exists() and later.exists()
    assert all(not Path(p.removeprefix("file://")).exists() for p in gone_manifest_lists)
    table = t.table.refresh()
    assert all(Path(p.removeprefix("file://")).exists() for p in referenced(table))
    assert deleted >= 2 + len(gone_manifest_lists)
    _reads_whole(table)
    f = figures(table)
    assert f["snapshots"] == 1 and f["manifests"] >= 1 and 0 < f["live_bytes"] <= f["disk_bytes"]


def test_a_bad_property_stops_the_pass_with_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    from types import SimpleNamespace

    from tierproxy.cli import _job_error

    with pytest.raises(BadTableProperty) as caught:
        Retention.of({"history.expire.max-snapshot-age-ms": "-1"}, "kafka.history")
    assert _job_error(caught.value, SimpleNamespace(own_bootstrap="b:9092")) == 2  # type: ignore[arg-type]
    err = capsys.readouterr().err
    assert err == ("tierproxy: config error: table kafka.history: property history.expire.max-snapshot-age-ms='-1' "
                   "is not a positive number\n"), err


def test_the_status_lists_a_tables_location_at_most_once_per_interval(tmp_path: Path) -> None:
    from tierproxy.jobs.iceberg.catalog import catalog_config, open_catalog
    from tierproxy.jobs.iceberg.status import DISK_EVERY_S, table_status

    cfg = catalog_config(None, f"file://{tmp_path}", "")
    open_catalog(cfg).create_namespace("ns")
    table = _append(open_catalog(cfg).create_table("ns.t", pa.schema([pa.field("n", pa.int64())])), 0, ledger=True)
    first = table_status(cfg, "ns.t", {}, clock=_clock(0))
    assert first["disk_bytes"] >= first["live_bytes"] > 0
    stray = Path(table.location().removeprefix("file://")) / "data" / "stray.parquet"
    stray.write_bytes(b"x" * 1000)
    # a request within the interval (GET /v1/iceberg, the metrics' refresh) does not list a big table again
    assert table_status(cfg, "ns.t", {}, clock=_clock(int(DISK_EVERY_S * 500)))["disk_bytes"] == first["disk_bytes"]
    later = table_status(cfg, "ns.t", {}, clock=_clock(int(DISK_EVERY_S * 1000)))
    assert later["disk_bytes"] == first["disk_bytes"] + 1000 and later["live_bytes"] == first["live_bytes"]
