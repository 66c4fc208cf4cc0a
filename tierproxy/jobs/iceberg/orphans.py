"""Data files of a table that no snapshot references: a killed pass's, a refused pass's, expired snapshots'.
Which of them may go is the cleaning pass's decision (`sync.IcebergSync._clean_orphans`: only behind a commit of its
own, never while another pass holds a live lease); this module finds them."""

from __future__ import annotations

import time
from typing import Any


def orphans(table: Any, pass_id: str, min_age_ms: int) -> list[tuple[str, float]]:
    """(URI, modification time) of each data file under the table's data/ that no snapshot references, older than
    `min_age_ms` and not written by pass `pass_id`."""
    referenced: set[str] = set()
    for snap in table.metadata.snapshots:
        for manifest in snap.manifests(table.io):
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
                referenced.add(entry.data_file.file_path)
    cutoff = time.time() - min_age_ms / 1000
    return [(path, mtime) for path, mtime in list_data_files(table)
            if path not in referenced and f"-{pass_id}.parquet" not in path and mtime <= cutoff]


def list_data_files(table: Any) -> list[tuple[str, float]]:
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
