"""Files of a table that nothing live refers to: a killed or refused pass's data files and manifests, expired
snapshots' data files, manifests and manifest lists, metadata files older than the table's metadata log. Which of
them may go is the cleaning pass's decision (`sync.IcebergSync._clean_orphans`: only behind a commit of its own,
never while another pass holds a live lease); this module finds them.

Live (never an orphan): the current metadata file and those in its metadata log (`write.metadata.previous-versions-
max`), every live snapshot's manifest list, its manifests and their data and delete files, statistics files. Only
files tierproxy or an Iceberg writer makes are considered: Parquet under data/, Avro and `.metadata.json` under
metadata/ (anything else under the location is left alone).
"""

from __future__ import annotations

from typing import Any


def referenced(table: Any) -> set[str]:
    """Every file the table's metadata refers to (module docstring); each manifest read once, however many
    snapshots share it."""
    md = table.metadata
    out = {table.metadata_location, *(e.metadata_file for e in md.metadata_log)}
    out.update(s.statistics_path for s in md.statistics)
    out.update(s.statistics_path for s in md.partition_statistics)
    seen: set[str] = set()
    for snap in md.snapshots:
        out.add(snap.manifest_list)
        for manifest in snap.manifests(table.io):
            if manifest.manifest_path in seen:
                continue
            seen.add(manifest.manifest_path)
            out.add(manifest.manifest_path)
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
                out.add(entry.data_file.file_path)
    return out


def orphans(table: Any, pass_id: str, min_age_ms: int, now_s: float) -> list[tuple[str, float]]:
    """(URI, modification time) of each data or metadata file of the table that nothing live refers to, older
    than `min_age_ms` at `now_s` and not written by pass `pass_id`."""
    live = referenced(table)
    cutoff = now_s - min_age_ms / 1000
    found = [(p, m) for p, m, _ in list_files(table, "data") if p.endswith(".parquet")]
    found += [(p, m) for p, m, _ in list_files(table, "metadata") if p.endswith((".avro", ".metadata.json"))]
    return [(path, mtime) for path, mtime in found
            if path not in live and f"-{pass_id}.parquet" not in path and mtime <= cutoff]


def list_files(table: Any, under: str) -> list[tuple[str, float, int]]:
    """(URI, modification time, size) of every file under the table's location (`under`: a directory in it, ""
    for all)."""
    from urllib.parse import urlparse

    from pyarrow.fs import FileSelector, FileType

    location = table.location().rstrip("/") + (f"/{under}" if under else "")
    u = urlparse(location)
    fs = table.io.fs_by_scheme(u.scheme, u.netloc)
    base = u.path if u.scheme == "file" else f"{u.netloc}{u.path}"
    prefix = f"{u.scheme}://" if u.scheme != "file" else "file://"
    try:
        infos = fs.get_file_info(FileSelector(base, recursive=True, allow_not_found=True))
    except FileNotFoundError:
        return []
    return [(prefix + i.path, i.mtime.timestamp() if i.mtime else 0.0, int(i.size or 0)) for i in infos
            if i.type == FileType.File]
