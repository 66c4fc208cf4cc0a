"""Which cluster a tier belongs to: recorded once, checked by every command that uses the tier, handed over only
by a restore.

A tier holds the history of one cluster's topics, named by their topic ids. Pointed at another cluster with the
same storage and metadata (a mistyped bootstrap), a tier pass would find none of those ids and could take every
tiered topic for deleted. So the first `tier` pass records the cluster's id beside the segments (the object
`cluster-id` under the tier's prefix), and `tier`, `serve` and `iceberg` refuse to start against a cluster with
another id (exit 2, both ids named). A tier written before this record existed gets it on its next `tier` pass.

`tierproxy restore` is the one hand-over: the tier's owner becomes the new cluster, and the lost one joins the
tier's `lineage` (oldest first). Anything still pointed at a cluster of the lineage is refused, naming the restore.
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


@dataclass(frozen=True)
class Ownership:
    cluster_id: str
    lineage: list[dict[str, object]] = field(default_factory=list)  # {"cluster_id", "handed_over_ms"}, oldest first

    @property
    def lineage_ids(self) -> list[str]:
        return [str(e["cluster_id"]) for e in self.lineage]


async def recorded_owner(rsm: RemoteStorageManager) -> Ownership | None:
    """The tier's owner and lineage, None when no owner is recorded yet."""
    try:
        raw = json.loads(await rsm.store.get(rsm.object_key(OWNER_OBJECT)))
    except ObjectMissing:
        return None
    return Ownership(str(raw["cluster_id"]), list(raw.get("lineage", [])))


async def recorded_cluster(rsm: RemoteStorageManager) -> str | None:
    """The cluster id recorded in the tier, None when none is recorded yet."""
    owner = await recorded_owner(rsm)
    return owner.cluster_id if owner else None


async def check_cluster(rsm: RemoteStorageManager, cluster_id: str | None, *, record: bool, brokers: str) -> None:
    """Raise WrongCluster when the tier belongs to another cluster than `cluster_id` (the brokers' own answer);
    with `record` (the tier job), a tier with no owner yet is given this one. A cluster that names no id (Metadata
    before v2) cannot be checked: it is let through with a warning, never recorded."""
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
    if owner is None and record:
        await rsm.store.put(rsm.object_key(OWNER_OBJECT), json.dumps({"cluster_id": cluster_id}).encode())
        log.info("the tier now belongs to cluster %s", cluster_id)


async def hand_over(rsm: RemoteStorageManager, old: Ownership, new_cluster: str) -> Ownership:
    """The tier's owner becomes `new_cluster`, `old`'s owner joins the lineage (a restore; nothing else)."""
    if old.cluster_id == new_cluster:
        return old
    handed = {"cluster_id": old.cluster_id, "handed_over_ms": int(time.time() * 1000)}
    new = Ownership(new_cluster, [*old.lineage, handed])
    await rsm.store.put(rsm.object_key(OWNER_OBJECT),
                        json.dumps({"cluster_id": new.cluster_id, "lineage": new.lineage}).encode())
    log.warning("the tier now belongs to cluster %s (restored from %s)", new_cluster, old.cluster_id)
    return new
