"""A catalog whose answer to a commit is lost after the commit was applied: what a REST catalog behind a gateway that
times out does (pyiceberg raises CommitStateUnknownException). The real embedded SQL catalog applies the commit; only
its answer is replaced, for commits whose new snapshot carries the summary key `lost`."""

from __future__ import annotations

from typing import Any

from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import CommitStateUnknownException


class LostReply(SqlCatalog):
    lost = ""  # the snapshot summary key whose commits lose their answer

    def commit_table(self, table: Any, requirements: Any, updates: Any) -> Any:
        response = super().commit_table(table, requirements, updates)
        for u in updates:
            summary = getattr(getattr(u, "snapshot", None), "summary", None)
            if summary is not None and self.lost in (summary.additional_properties or {}):
                raise CommitStateUnknownException("504 Gateway Timeout")
        return response


def lossy(cfg: Any, lost: str) -> LostReply:
    """The catalog of `cfg` (a `catalog.CatalogConfig` of the embedded SQL catalog), losing its answers to commits
    whose snapshot carries `lost`."""
    catalog = LostReply("tierproxy", uri=cfg.uri, warehouse=cfg.warehouse, **cfg.io)
    catalog.lost = lost
    return catalog
