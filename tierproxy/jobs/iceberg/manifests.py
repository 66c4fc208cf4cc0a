"""The current snapshot's manifests merged once they reach `commit.manifest.min-count-to-merge` (`maintenance`), and
a table's figures (live bytes, bytes on disk, snapshots, manifests).

pyiceberg 0.12 has no `rewrite_manifests`; its merging append (`merge_append`, what Iceberg's appends do with
`commit.manifest-merge.enabled`) is used with no file added: one `append` snapshot whose manifest list holds the
merged manifests (each live file as an existing entry, its sequence numbers kept), the ledger in its summary
unchanged and `tierproxy.maintenance` = the pass. Rows and files do not change; older snapshots keep their manifests
until they expire.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tierproxy.jobs.iceberg.maintenance import MAINTENANCE, Retention


def data_manifests(table: Any) -> int:
    """The current snapshot's data manifests."""
    from pyiceberg.manifest import ManifestContent

    snap = table.current_snapshot()
    return 0 if snap is None else sum(1 for m in snap.manifests(table.io) if m.content == ManifestContent.DATA)


def rewrite_manifests(table: Any, at: int | None, r: Retention, props: dict[str, str], pass_id: str,
                      before_commit: Callable[[], None] = lambda: None) -> int:
    """Merge the current snapshot's data manifests when they reach the table's bound, in one commit from `at`;
    returns how many manifests were merged (0: below the bound, or merging off). Raises what the catalog raises."""
    from pyiceberg.manifest import ManifestContent

    from tierproxy.jobs.iceberg.writer import require_at

    snap = table.current_snapshot()
    count = 0 if snap is None else sum(  # what a merging append carries over (a manifest of deletes only is not)
        1 for m in snap.manifests(table.io) if m.content == ManifestContent.DATA and (m.has_added_files() or
                                                                                     m.has_existing_files()))
    if not r.merge_enabled or count < max(2, r.min_count_to_merge):
        return 0
    with table.transaction() as tx:
        require_at(tx, at)
        merge = tx.update_snapshot(snapshot_properties={**props, MAINTENANCE: pass_id}).merge_append()
        tune_merge(merge, r)
        merge.commit()  # the merged manifests and the manifest list are written here
        before_commit()
    return count


def tune_merge(merge: Any, r: Retention) -> None:
    """The table's own bound on pyiceberg's merging append, with Java's defaults where pyiceberg's differ (it reads
    them in its constructor, into private fields: PyicebergChanged when they are not there, never set on nothing)."""
    from tierproxy.jobs.iceberg.writer import needs

    needs(merge, "_merge_enabled", "_min_count_to_merge", "_target_size_bytes")
    merge._merge_enabled, merge._min_count_to_merge = True, max(2, r.min_count_to_merge)
    merge._target_size_bytes = r.manifest_target_bytes


def figures(table: Any, disk_bytes: Callable[[Any], int] | None = None) -> dict[str, int]:
    """live_bytes: the current snapshot's data files and the metadata reading it needs (its metadata file, manifest
    list, manifests); disk_bytes: every file under the table's location (`disk_bytes(table)`, default
    `listed_bytes`: a listing of it); snapshots; manifests (the current snapshot's)."""
    snap = table.current_snapshot()
    live = 0
    manifests = 0
    if snap is not None:
        summary = snap.summary.additional_properties if snap.summary is not None else {}
        live += int(summary.get("total-files-size", 0) or 0)
        for m in snap.manifests(table.io):
            live += int(m.manifest_length)
            manifests += 1
        live += len(table.io.new_input(snap.manifest_list))
    live += len(table.io.new_input(table.metadata_location))
    return {"live_bytes": live, "disk_bytes": (disk_bytes or listed_bytes)(table),
            "snapshots": len(table.metadata.snapshots), "manifests": manifests}


def listed_bytes(table: Any) -> int:
    """The bytes of every file under the table's location: a listing of it (a request per thousand files on S3)."""
    from tierproxy.jobs.iceberg.orphans import list_files

    return sum(size for _, _, size in list_files(table, ""))
