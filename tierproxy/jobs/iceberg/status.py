"""The table as an operator sees it: per partition, the tier's end against the table's end (the lag), the last
commit, files and rows, and what maintenance bounds (`manifests.figures`: live bytes, bytes on disk, snapshots,
manifests; bytes on disk lists the table's location, at most every `DISK_EVERY_S` per table: a status request or a
metrics refresh does not list a big table each time). Read from the catalog (the ledger in the current snapshot)
and the tier's metadata, so every replica and the CLI show the same figures without asking the job."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from tierproxy.jobs.iceberg.catalog import CatalogConfig, CatalogError, open_catalog, safe_uri
from tierproxy.jobs.iceberg.ledger import current_ledger

DISK_EVERY_S = 300.0
_disk: dict[str, tuple[float, int]] = {}  # table location → (listed at, bytes): one entry per table shown
_disk_lock = threading.Lock()  # (statuses are made in worker threads)


def disk_bytes(table: Any, now_s: float) -> int:
    """`manifests.listed_bytes` of the table, listed again only once the last listing is `DISK_EVERY_S` old."""
    from tierproxy.jobs.iceberg.manifests import listed_bytes

    location = table.location()
    with _disk_lock:
        seen = _disk.get(location)
    if seen is not None and 0 <= now_s - seen[0] < DISK_EVERY_S:
        return seen[1]
    found = listed_bytes(table)
    with _disk_lock:
        _disk[location] = (now_s, found)
    return found


def serve_catalog(storage: str, uri: str | None, credential: str | None = None,
                  token: str | None = None) -> CatalogConfig:
    """The catalog a proxy replica reads the table's status from: `iceberg.catalog`; `embedded` only next to a
    file:// tier (an S3 tier's embedded catalog lives in the tier job's state directory, out of a replica's reach)."""
    from tierproxy.jobs.iceberg.catalog import catalog_config

    if uri in (None, "", "embedded"):
        if not storage.startswith("file:"):
            raise CatalogError("the embedded catalog of an S3 tier lives with the tier job: set iceberg.catalog to a "
                               "shared catalog (a database URL or a REST catalog) to see the table here")
        return catalog_config(None, storage, "")
    return catalog_config(uri, storage, "", credential=credential, token=token)


def table_status(cfg: CatalogConfig, name: str, tier_ends: dict[tuple[str, int], tuple[str, int]],
                 clock: Callable[[], float] = time.time) -> dict[str, Any]:
    """`tier_ends`: (topic id, partition) → (topic, the offset after the tier's last one). Partitions of the
    tier that the table has not reached, and those it has, each with its lag in offsets. `clock`: what decides
    whether bytes on disk are listed again (`disk_bytes`)."""
    from pyiceberg.exceptions import NoSuchTableError

    try:
        table = open_catalog(cfg).load_table(name)
    except NoSuchTableError:
        return {"table": name, "catalog": safe_uri(cfg.uri), "exists": False, "partitions": [],
                "lag_offsets": sum(end for _, end in tier_ends.values())}
    except CatalogError:
        raise
    except Exception as exc:
        raise CatalogError(f"catalog {safe_uri(cfg.uri)}: table {name}: {type(exc).__name__}: "
                           f"{cfg.redact(str(exc))}") from None
    snap = table.current_snapshot()
    props = dict(snap.summary.additional_properties) if snap is not None and snap.summary is not None else {}
    ledger = current_ledger(table)
    from tierproxy.jobs.iceberg.manifests import figures

    parts = []
    for (tid, p), (topic, tier_end) in sorted(tier_ends.items(), key=lambda kv: (kv[1][0], kv[0][1])):
        table_end = ledger.ends.get(f"{tid}:{p}", ledger.starts.get(f"{tid}:{p}", 0))
        parts.append({"topic": topic, "partition": p, "tier_end": tier_end, "table_end": table_end,
                      "lag": max(0, tier_end - table_end)})
    return {"table": name, "catalog": safe_uri(cfg.uri), "exists": True,
            "snapshot_id": snap.snapshot_id if snap is not None else None,
            "last_commit_ms": snap.timestamp_ms if snap is not None else None,
            "files": int(props.get("total-data-files", 0) or 0), "rows": int(props.get("total-records", 0) or 0),
            "partitions": parts, "lag_offsets": sum(x["lag"] for x in parts),
            **figures(table, lambda t: disk_bytes(t, clock()))}  # what maintenance keeps bounded


def typed_status(cfg: CatalogConfig, rules: str,
                 tier_ends: dict[tuple[str, int], tuple[str, int]]) -> list[dict[str, Any]]:
    """Each typed table of a tiered topic (`iceberg.tables`): its status as `table_status` gives it, against its own
    topic's partitions, and `dead_letters`, the rows of its dead-letter table."""
    from tierproxy.config.values import typed_table_for, typed_table_rules

    parsed = typed_table_rules(rules)
    out = []
    for topic in sorted({t for t, _ in tier_ends.values()}):
        name = typed_table_for(parsed, topic)
        if name is None:
            continue
        st = table_status(cfg, name, {k: v for k, v in tier_ends.items() if v[0] == topic})
        st["topic"] = topic
        st["dead_letters"] = table_status(cfg, f"{name}_dlq", {}).get("rows", 0)
        out.append(st)
    return out
