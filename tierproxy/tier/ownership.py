"""Which cluster a tier belongs to: recorded once, checked by every command that uses the tier, handed over only
by a restore.

A tier holds the history of one cluster's topics, named by their topic ids. Pointed at another cluster with the
same storage and metadata (a mistyped bootstrap), a tier pass would find none of those ids and could take every
tiered topic for deleted. So the first `tier` pass records the cluster's id beside the segments (the object
`cluster-id` under the tier's prefix), and `tier`, `serve` and `iceberg` refuse to start against a cluster with
another id (exit 2, both ids named). A tier written before this record existed gets it on its next `tier` pass.

`tierproxy restore` is the one hand-over: the tier's owner becomes the new cluster, and the lost one joins the
tier's `lineage` (oldest first). Anything still pointed at a cluster of the lineage is refused, naming the restore.
From the hand-over until the restore has written its mounts, the record also says a restore is in progress
(`restoring`): until a mount says that a restored topic's id there continues the old history, a `tier` pass on the
new cluster would tier that topic under the new cluster's own id, segments the tier would then neither serve nor
delete. So the tier job refuses the cluster while it is said (`RestoreInProgress`); a killed restore leaves it said
until its rerun has written the mounts.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field

from tierproxy.tier.rsm import RemoteStorageManager
from tierproxy.tier.storage import ObjectMissing

log = logging.getLogger("tierproxy.tier")
OWNER_OBJECT = "cluster-id"


class WrongCluster(RuntimeError):
    """The brokers are another cluster than the one the tier belongs to."""


class RestoreInProgress(WrongCluster):
    """A restore into this cluster has handed the tier over but not yet written its mounts: no `tier` pass."""


@dataclass(frozen=True)
class Ownership:
    cluster_id: str
    lineage: list[dict[str, object]] = field(default_factory=list)  # {"cluster_id", "handed_over_ms"}, oldest first
    restoring: dict[str, object] | None = None  # {"source", "started_ms"}: hand-over written, mounts not yet

    @property
    def lineage_ids(self) -> list[str]:
        return [str(e["cluster_id"]) for e in self.lineage]


async def recorded_owner(rsm: RemoteStorageManager) -> Ownership | None:
    """The tier's owner and lineage, None when no owner is recorded yet."""
    try:
        raw = json.loads(await rsm.store.get(rsm.object_key(OWNER_OBJECT)))
    except ObjectMissing:
        return None
    return Ownership(str(raw["cluster_id"]), list(raw.get("lineage", [])), raw.get("restoring"))


async def _put(rsm: RemoteStorageManager, owner: Ownership) -> None:
    raw: dict[str, object] = {"cluster_id": owner.cluster_id, "lineage": owner.lineage}
    if owner.restoring is not None:
        raw["restoring"] = owner.restoring
    await rsm.store.put(rsm.object_key(OWNER_OBJECT), json.dumps(raw).encode())


async def recorded_cluster(rsm: RemoteStorageManager) -> str | None:
    """The cluster id recorded in the tier, None when none is recorded yet."""
    owner = await recorded_owner(rsm)
    return owner.cluster_id if owner else None


async def check_cluster(rsm: RemoteStorageManager, cluster_id: str | None, *, record: bool, brokers: str) -> None:
    """Raise WrongCluster when the tier belongs to another cluster than `cluster_id` (the brokers' own answer);
    with `record` (the tier job), a tier with no owner yet is given this one, and a restore into the cluster still
    in progress raises RestoreInProgress (nothing may be tiered before its mounts exist). A cluster that names no
    id (Metadata before v2) cannot be checked: it is let through with a warning, never recorded."""
    if not cluster_id:
        log.warning("the brokers at %s name no cluster id: the tier's owner cannot be checked", brokers)
        return
    owner = await recorded_owner(rsm)
    if owner is not None and cluster_id in owner.lineage_ids:
        raise WrongCluster(f"the tier was restored from cluster {cluster_id} onto cluster {owner.cluster_id}: "
                           f"refusing to use it with the brokers at {brokers}, the old cluster (point "
                           f"bootstrap.servers at cluster {owner.cluster_id})")
    if owner is not None and owner.cluster_id != cluster_id:
        raise WrongCluster(f"the tier belongs to cluster {owner.cluster_id}, but the brokers at {brokers} are cluster "
                           f"{cluster_id}: refusing to use it (check bootstrap.servers, or hand the tier to this "
                           "cluster with `tierproxy restore`)")
    if owner is not None and record and owner.restoring is not None:
        raise RestoreInProgress(
            f"a restore of cluster {owner.restoring.get('source', '?')} into cluster {cluster_id} is in progress "
            f"(begun at {owner.restoring.get('started_ms', '?')} ms; the tier is handed over, the restored topics' "
            "mounts are not written yet): refusing a tier pass, which would tier a restored topic under this "
            "cluster's own id; run `tierproxy restore` again to finish it")
    if owner is None and record:
        await _put(rsm, Ownership(cluster_id))
        log.info("the tier now belongs to cluster %s", cluster_id)


async def hand_over(rsm: RemoteStorageManager, old: Ownership | None, new_cluster: str, source: str,
                    now_ms: int | None = None) -> Ownership:
    """A restore begins: the tier's owner becomes `new_cluster` (`old`'s owner, or `source` for a tier that
    recorded none, joins the lineage) and the record says a restore from `source` is in progress until
    `restore_finished`. A rerun or a later stage (the owner is `new_cluster` already) says it again."""
    now = int(time.time() * 1000) if now_ms is None else now_ms
    old = old if old is not None else Ownership(source)
    lineage = old.lineage if old.cluster_id == new_cluster else \
        [*old.lineage, {"cluster_id": old.cluster_id, "handed_over_ms": now}]
    new = Ownership(new_cluster, lineage, {"source": source, "started_ms": now})
    await _put(rsm, new)
    if old.cluster_id != new_cluster:
        log.warning("the tier now belongs to cluster %s (restored from %s)", new_cluster, old.cluster_id)
    return new


async def restore_finished(rsm: RemoteStorageManager, cluster: str) -> None:
    """The restore into `cluster` has written its mounts: `tier` passes on it may run again."""
    owner = await recorded_owner(rsm)
    if owner is not None and owner.cluster_id == cluster and owner.restoring is not None:
        await _put(rsm, Ownership(owner.cluster_id, owner.lineage))
