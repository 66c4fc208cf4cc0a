"""Which cluster a tier belongs to: recorded once, checked by every command that uses the tier.

A tier holds the history of one cluster's topics, named by their topic ids. Pointed at another cluster with the
same storage and metadata (a mistyped bootstrap), a tier pass would find none of those ids and could take every
tiered topic for deleted. So the first `tier` pass records the cluster's id beside the segments (the object
`cluster-id` under the tier's prefix), and `tier`, `serve` and `iceberg` refuse to start against a cluster with
another id (exit 2, both ids named). A tier written before this record existed gets it on its next `tier` pass.
"""

from __future__ import annotations

import json
import logging

from tierproxy.tier.rsm import RemoteStorageManager
from tierproxy.tier.storage import ObjectMissing

log = logging.getLogger("tierproxy.tier")
OWNER_OBJECT = "cluster-id"


class WrongCluster(RuntimeError):
    """The brokers are another cluster than the one the tier belongs to."""


async def recorded_cluster(rsm: RemoteStorageManager) -> str | None:
    """The cluster id recorded in the tier, None when none is recorded yet."""
    try:
        raw = await rsm.store.get(rsm.object_key(OWNER_OBJECT))
    except ObjectMissing:
        return None
    return str(json.loads(raw)["cluster_id"])


async def check_cluster(rsm: RemoteStorageManager, cluster_id: str | None, *, record: bool, brokers: str) -> None:
    """Raise WrongCluster when the tier belongs to another cluster than `cluster_id` (the brokers' own answer);
    with `record` (the tier job), a tier with no owner yet is given this one. A cluster that names no id (Metadata
    before v2) cannot be checked: it is let through with a warning, never recorded."""
    if not cluster_id:
        log.warning("the brokers at %s name no cluster id: the tier's owner cannot be checked", brokers)
        return
    recorded = await recorded_cluster(rsm)
    if recorded is not None and recorded != cluster_id:
        raise WrongCluster(f"the tier belongs to cluster {recorded}, but the brokers at {brokers} are cluster "
                           f"{cluster_id}: refusing to use it (check bootstrap.servers)")
    if recorded is None and record:
        await rsm.store.put(rsm.object_key(OWNER_OBJECT), json.dumps({"cluster_id": cluster_id}).encode())
        log.info("the tier now belongs to cluster %s", cluster_id)
