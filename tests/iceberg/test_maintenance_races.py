"""Maintenance against another engine's commits between its plan and its commit (pyiceberg's SQL catalog on SQLite,
files on disk): a branch committed to or a tag moved meanwhile is never removed by a plan made before it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.exceptions import CommitFailedException

from tests.iceberg.test_maintenance import _append, _reads_whole, _table
from tierproxy.jobs.iceberg.ledger import Ledger
from tierproxy.jobs.iceberg.maintenance import DAY_MS, Retention, expire, plan_expiry
from tierproxy.jobs.iceberg.writer import require_at


def _two_snapshots_and_a_branch(tmp: Path) -> tuple[Any, Any, Any]:
    table = _table(tmp)
    for i in range(3):
        table = _append(table, i * 10, ledger=True)
    first, _, head = table.metadata.snapshots
    table.manage_snapshots().create_branch(first.snapshot_id, "audit").commit()
    return table.refresh(), first, head


def test_a_branch_committed_to_after_the_plan_is_not_removed_by_its_max_ref_age(tmp_path: Path) -> None:
    table, _, head = _two_snapshots_and_a_branch(tmp_path)
    now = head.timestamp_ms + 6 * DAY_MS
    plan = plan_expiry(table.metadata, now, Retention.of({"history.expire.max-ref-age-ms": str(DAY_MS)}, "ns.t"),
                       {head.snapshot_id})
    assert plan.refs == ["audit"]
    # another engine writes to the branch: it is young again, its new snapshot holds rows no other one has
    other = table.catalog.load_table("ns.t")
    other.append(pa.table({"n": pa.array([1000], pa.int64())}), branch="audit")
    branch_head = other.refresh().metadata.refs["audit"].snapshot_id

    with pytest.raises(CommitFailedException):  # the stale plan is refused, as a moved main is
        expire(table, head.snapshot_id, plan)
    table = table.refresh()
    assert table.metadata.refs["audit"].snapshot_id == branch_head
    assert 1000 in table.scan(snapshot_id=branch_head).to_arrow()["n"].to_pylist()
    _reads_whole(table)


def test_a_tag_moved_onto_an_expiring_snapshot_after_the_plan_keeps_it(tmp_path: Path) -> None:
    table, first, head = _two_snapshots_and_a_branch(tmp_path)
    table.manage_snapshots().remove_branch("audit").create_tag(head.snapshot_id, "audit").commit()
    table = table.refresh()
    plan = plan_expiry(table.metadata, head.timestamp_ms + 6 * DAY_MS, Retention(), {head.snapshot_id})
    assert first.snapshot_id in plan.snapshots and plan.refs == []
    # another engine points the tag at the oldest snapshot (the time travel someone keeps)
    table.catalog.load_table("ns.t").manage_snapshots().remove_tag("audit").create_tag(
        first.snapshot_id, "audit").commit()

    with pytest.raises(CommitFailedException):
        expire(table, head.snapshot_id, plan)
    table = table.refresh()
    assert table.metadata.refs["audit"].snapshot_id == first.snapshot_id
    assert table.metadata.snapshot_by_id(first.snapshot_id) is not None
    _reads_whole(table)


def test_pyicebergs_private_fields_maintenance_sets_are_there_and_their_absence_stops_it(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from tierproxy.jobs.iceberg.manifests import tune_merge
    from tierproxy.jobs.iceberg.writer import PyicebergChanged

    table = _table(tmp_path)
    with table.transaction() as tx:  # the installed pyiceberg (pinned <0.13) has them: tuned as the table says
        merge = tx.update_snapshot().merge_append()
        tune_merge(merge, Retention(min_count_to_merge=7, manifest_target_bytes=1 << 20))
        assert (merge._merge_enabled, merge._min_count_to_merge, merge._target_size_bytes) == (True, 7, 1 << 20)
    # a pyiceberg whose merging append lost them: a clear error, not attributes set on nothing (merging silently
    # off, an empty snapshot every pass) swallowed by maintenance's "a later pass does it"
    with pytest.raises(PyicebergChanged, match="_merge_enabled, _min_count_to_merge, _target_size_bytes"):
        tune_merge(SimpleNamespace(), Retention())
    with pytest.raises(PyicebergChanged, match="_apply"):
        require_at(SimpleNamespace(), None)


def test_the_ledger_reads_the_same_after_a_merge_and_an_expiry_of_a_table_without_its_property(
        tmp_path: Path) -> None:
    from tests.iceberg.test_maintenance import Target, _clock
    from tierproxy.jobs.iceberg.cleanup import Cleanup
    from tierproxy.jobs.iceberg.ledger import LEDGER, current_ledger, snapshot_at

    table = _table(tmp_path)
    for i in range(6):  # a table from before the ledger property: read from the summaries, walking back
        ledger = Ledger({"a:0": 10 * (i + 1), "a:1": 5 * (i + 1)}, {"a:0": 0}, {"t": "a"}, ids={"old": "t"})
        table.append(pa.table({"n": pa.array(range(i * 10, i * 10 + 10), pa.int64())}),
                     snapshot_properties=ledger.summary(f"p{i}", [f"s{i}"]))
    with table.transaction() as tx:
        tx.set_properties({"commit.manifest.min-count-to-merge": "6", "history.expire.max-snapshot-age-ms": "1"})
    table = table.refresh()
    assert LEDGER not in table.properties
    before = current_ledger(table)
    t = Target(table)
    done = Cleanup(30_000, 0, _clock(table.current_snapshot().timestamp_ms + 1000)).maintain(t, "m")
    assert done.manifests_merged == 6 and done.snapshots_expired == 5  # the merge's parent stays: main's minimum
    after = current_ledger(t.table)
    assert (after.ends, after.starts, after.topics, after.ids) == (before.ends, before.starts, before.topics,
                                                                   before.ids)
    snap, tid = snapshot_at(t.table, "t", {0: 60, 1: 30})
    assert tid == "a" and snap is not None and snap.snapshot_id in {s.snapshot_id for s in t.table.metadata.snapshots}
    assert sorted(t.table.scan(snapshot_id=snap.snapshot_id).to_arrow()["n"].to_pylist()) == list(range(60))
