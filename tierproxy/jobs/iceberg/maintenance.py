"""Table maintenance by the table's own properties, with Iceberg's names and defaults: which snapshots expire, and
when the current snapshot's manifests are rewritten.

    history.expire.max-snapshot-age-ms    5 days   a branch keeps its ancestors younger than this ...
    history.expire.min-snapshots-to-keep  1        ... and at least this many of them (the time travel kept)
    history.expire.max-ref-age-ms         forever  a tag or branch (never main) older than this is removed
    commit.manifest-merge.enabled         true     (Java's default; pyiceberg's appends do not merge by theirs)
    commit.manifest.min-count-to-merge    100      the current snapshot's data manifests are merged from this many
    commit.manifest.target-size-bytes     8 MiB    into manifests of about this size

The snapshots kept are Java's `RemoveSnapshots` rules (per retained branch: its ancestry from the head while younger
than the age or fewer than the minimum; every tag's snapshot; a snapshot no retained ref reaches while younger than
the age; a ref's own `max-snapshot-age-ms`, `min-snapshots-to-keep`, `max-ref-age-ms` over the table's), plus what
tierproxy needs: main's ancestry down to the newest snapshot that carries the ledger (`ledger.current_ledger` reads
a table without the ledger property from it, walking there). Time is the clock the caller passes in.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

DAY_MS = 86_400_000
MAX_SNAPSHOT_AGE = "history.expire.max-snapshot-age-ms"
MIN_SNAPSHOTS = "history.expire.min-snapshots-to-keep"
MAX_REF_AGE = "history.expire.max-ref-age-ms"
MERGE_ENABLED = "commit.manifest-merge.enabled"
MIN_COUNT_TO_MERGE = "commit.manifest.min-count-to-merge"
MANIFEST_TARGET = "commit.manifest.target-size-bytes"
MAINTENANCE = "tierproxy.maintenance"  # snapshot summary key: the pass whose manifest rewrite made the snapshot


class BadTableProperty(ValueError):
    """A maintenance property of the table that is not a value of its kind (exit 2, naming it)."""


@dataclass(frozen=True)
class Retention:
    """A table's maintenance settings (module docstring)."""

    max_snapshot_age_ms: int = 5 * DAY_MS
    min_snapshots_to_keep: int = 1
    max_ref_age_ms: int | None = None  # forever
    merge_enabled: bool = True
    min_count_to_merge: int = 100
    manifest_target_bytes: int = 8 << 20

    @classmethod
    def of(cls, properties: Mapping[str, str], table: str) -> Retention:
        """The table's settings; BadTableProperty naming the first that is not a positive number (a boolean)."""
        d = cls()

        def number(key: str, default: int | None) -> int | None:
            raw = properties.get(key)
            if raw is None:
                return default
            if not raw.strip().isdecimal() or int(raw) <= 0:  # (isdigit: "²" too, which int() refuses)
                raise BadTableProperty(f"table {table}: property {key}={raw!r} is not a positive number")
            return int(raw)

        merge = properties.get(MERGE_ENABLED, "true").strip().lower()
        if merge not in ("true", "false"):
            raise BadTableProperty(f"table {table}: property {MERGE_ENABLED}={merge!r} is not true or false")
        return cls(number(MAX_SNAPSHOT_AGE, d.max_snapshot_age_ms) or d.max_snapshot_age_ms,
                   number(MIN_SNAPSHOTS, d.min_snapshots_to_keep) or d.min_snapshots_to_keep,
                   number(MAX_REF_AGE, None), merge == "true",
                   number(MIN_COUNT_TO_MERGE, d.min_count_to_merge) or d.min_count_to_merge,
                   number(MANIFEST_TARGET, d.manifest_target_bytes) or d.manifest_target_bytes)


@dataclass(frozen=True)
class Expiry:
    snapshots: list[int]  # ids to expire
    refs: list[str]  # tags and branches older than their max ref age, removed first


def _ancestry(metadata: Any, snapshot_id: int) -> list[Any]:
    """A snapshot and its ancestors, newest first (bounded by the snapshots the metadata holds)."""
    out: list[Any] = []
    snap = metadata.snapshot_by_id(snapshot_id)
    while snap is not None and len(out) <= len(metadata.snapshots):
        out.append(snap)
        snap = metadata.snapshot_by_id(snap.parent_snapshot_id) if snap.parent_snapshot_id is not None else None
    return out


def plan_expiry(metadata: Any, now_ms: int, r: Retention, protected: Collection[int] = ()) -> Expiry:
    """What expires at `now_ms` by Iceberg's rules (module docstring); never a snapshot in `protected`."""
    older_than = now_ms - r.max_snapshot_age_ms
    retained_refs, dropped = {}, []
    for name, ref in metadata.refs.items():
        snap = metadata.snapshot_by_id(ref.snapshot_id)
        max_ref_age = ref.max_ref_age_ms or r.max_ref_age_ms
        if name == "main" or (snap is not None and (max_ref_age is None or now_ms - snap.timestamp_ms <= max_ref_age)):
            retained_refs[name] = ref
        else:
            dropped.append(name)
    keep: set[int] = set(protected)
    reached: set[int] = set()
    for ref in retained_refs.values():
        if ref.snapshot_ref_type != "branch":
            keep.add(ref.snapshot_id)
            reached.add(ref.snapshot_id)
            continue
        cutoff = now_ms - ref.max_snapshot_age_ms if ref.max_snapshot_age_ms else older_than
        minimum = ref.min_snapshots_to_keep or r.min_snapshots_to_keep
        chain = _ancestry(metadata, ref.snapshot_id)
        reached.update(s.snapshot_id for s in chain)
        for kept, s in enumerate(chain):  # a contiguous prefix of the branch: the first too old past the minimum
            if kept >= minimum and s.timestamp_ms < cutoff:  # ends it
                break
            keep.add(s.snapshot_id)
    keep.update(s.snapshot_id for s in metadata.snapshots if s.snapshot_id not in reached and
                s.timestamp_ms >= older_than)
    return Expiry([s.snapshot_id for s in metadata.snapshots if s.snapshot_id not in keep], sorted(dropped))


def ledger_chain(table: Any) -> set[int]:
    """Main's head and its ancestors down to the newest whose summary carries the ledger: what `current_ledger`
    walks to read a table without the ledger property (an expired one between would end its walk early)."""
    from tierproxy.jobs.iceberg.ledger import ENDS

    current = table.current_snapshot()
    chain: set[int] = set()
    for snap in _ancestry(table.metadata, current.snapshot_id) if current is not None else []:
        chain.add(int(snap.snapshot_id))
        if snap.summary is not None and ENDS in snap.summary.additional_properties:
            return chain
    return set()


def expire(table: Any, at: int | None, plan: Expiry) -> int:
    """Commit `plan` (made from `table`'s metadata) if main is still at `at` and every other ref where the plan saw
    it (one metadata commit: refs removed, then snapshots); returns how many snapshots it expired. Raises what the
    catalog raises (another commit came first, to main or to any ref: a later pass does it). Why every ref: the
    catalog applies the removals to its current metadata, where a ref removed by age may have been committed to
    since, and a snapshot removed takes every ref now pointing at it along (pyiceberg's and Java's rule)."""
    from pyiceberg.table.update.snapshot import ExpireSnapshots, ManageSnapshots

    from tierproxy.jobs.iceberg.writer import require_at, require_refs

    if not plan.snapshots and not plan.refs:
        return 0
    with table.transaction() as tx:
        require_at(tx, at)
        require_refs(tx, tx.table_metadata.refs)
        if plan.refs:
            manage = ManageSnapshots(tx)
            for name in plan.refs:
                ref = tx.table_metadata.refs[name]
                manage = manage.remove_tag(name) if ref.snapshot_ref_type == "tag" else manage.remove_branch(name)
            manage.commit()
        if plan.snapshots:
            ExpireSnapshots(tx).by_ids(plan.snapshots).commit()
    return len(plan.snapshots)
