"""Step 4 of a pass, per table: expiry after a purge, maintenance by the table's properties (`maintenance`,
`manifests`), then orphan cleanup (`orphans`).

Maintenance runs only while no other pass holds a live lease (a writing pass's snapshot and files are not to be
touched) and commits only from the snapshot it planned from (the compare-and-swap of `writer.require_at`): a pass
that committed meanwhile makes it refuse, and the next pass does it. It never expires main's head, its ancestry
down to the snapshot carrying the ledger, or a ref's head. Orphans are deleted only behind a commit of the cleaning
pass (an empty one when it committed nothing): no pass that planned before it can commit any more, so what it
deletes can never be referenced later.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tierproxy.jobs.iceberg.ledger import PASS, current_ledger
from tierproxy.jobs.iceberg.maintenance import Retention, expire, ledger_chain, plan_expiry
from tierproxy.jobs.iceberg.manifests import rewrite_manifests
from tierproxy.jobs.iceberg.orphans import orphans
from tierproxy.jobs.iceberg.pauses import pause_point
from tierproxy.jobs.iceberg.writer import PyicebergChanged, commit_empty, live_lease

log = logging.getLogger(__name__)


@dataclass
class Maintained:
    snapshots_expired: int = 0
    manifests_merged: int = 0


class Cleanup:
    """`target` below is a pass's `sync._Target`: its table, name, `at` (the snapshot it writes from) and `fence_ms`
    (when it last committed), both updated by the commits made here."""

    def __init__(self, lease_ms: int, orphan_min_age_ms: int, clock: Callable[[], float]) -> None:
        self.lease_ms, self.orphan_min_age_ms, self.clock = lease_ms, orphan_min_age_ms, clock

    def after_purge(self, table: Any) -> int:
        """Expire every snapshot but the current one and refs' heads, so rows removed from the table are not kept
        by time travel (`--retention follow`)."""
        heads = {ref.snapshot_id for ref in table.metadata.refs.values()}
        old = [s.snapshot_id for s in table.metadata.snapshots if s.snapshot_id not in heads]
        if old:
            table.maintenance.expire_snapshots().by_ids(old).commit()
        return len(old)

    def maintain(self, target: Any, pass_id: str) -> Maintained:
        """Expire snapshots and merge manifests by the table's properties (BadTableProperty when one is wrong)."""
        done = Maintained()
        table = target.table = target.table.refresh()
        current = table.current_snapshot()
        if current is None or live_lease(table, self.lease_ms) is not None:
            return done
        r = Retention.of(table.properties, target.name)
        protected = {current.snapshot_id} | ledger_chain(table)
        plan = plan_expiry(table.metadata, int(self.clock() * 1000), r, protected)
        at = current.snapshot_id
        try:
            done.snapshots_expired = expire(table, at, plan)
            table = target.table = table.refresh()
            props = {k: v for k, v in current_ledger(table).summary(pass_id, []).items() if k != PASS}
            done.manifests_merged = rewrite_manifests(table, at, r, props, pass_id,
                                                      before_commit=lambda: pause_point("maintenance"))
        except PyicebergChanged:  # no later pass would do better: said, not logged away
            raise
        except Exception as exc:  # another commit came first, or the catalog did not answer: a later pass does it
            log.info("iceberg: table %s: maintenance left to a later pass (%s: %s)", target.name, type(exc).__name__,
                     str(exc).partition("\n")[0][:200])
        target.table = target.table.refresh()
        snap = target.table.current_snapshot()
        if done.manifests_merged and snap is not None and snap.snapshot_id != at:
            target.at, target.fence_ms = snap.snapshot_id, snap.timestamp_ms
        if done.snapshots_expired or done.manifests_merged:
            log.info("iceberg: table %s: %d snapshots expired, %d manifests merged", target.name,
                     done.snapshots_expired, done.manifests_merged)
        return done

    def clean_orphans(self, target: Any, pass_id: str) -> int:
        """Delete files nothing live refers to (`orphans`), older than the orphan age and than this pass's last
        commit, never while another pass holds a live lease (its files are referenced by no snapshot yet)."""
        table = target.table = target.table.refresh()
        if live_lease(table, self.lease_ms) is not None:
            return 0
        found = orphans(table, pass_id, self.orphan_min_age_ms, self.clock())
        if found and target.fence_ms is None:
            summary = {k: v for k, v in current_ledger(table).summary(pass_id, []).items() if k != PASS}
            current = table.current_snapshot()
            try:
                target.table, target.at = commit_empty(table, current.snapshot_id if current else None, summary)
            except Exception as exc:  # another commit came first: a later pass cleans up
                log.info("iceberg: table %s: no orphan cleanup this pass (%s)", target.name, type(exc).__name__)
                return 0
            target.fence_ms = target.table.current_snapshot().timestamp_ms
        n = 0
        for path, mtime in found:
            if mtime * 1000 >= (target.fence_ms or 0):  # written by a pass that planned after the fence
                continue
            target.table.io.delete(path)
            n += 1
            if n == 1:
                pause_point("cleanup")
        return n
