"""Purge records: a DeleteRecords is in the tier the moment it is recorded, not only at the next pass's snapshot.

The metadata topic lives in the cluster: a purge recorded there after the last `tier` pass would be lost with the
cluster, and a restore would serve the purged offsets again. So the proxy writes, before it records the purge in
the metadata and answers, one small object beside the snapshots, `purges/<topic id>-<partition>/<log start>.json`,
holding the purge as a metadata record (`RemoteLogStartOffset`, key and value) like the one it then writes. One
object per purge, named by its log start: two proxies purging a partition at once never overwrite each other's.
A restore (`with_purges`) replays every purge record above what its snapshot holds: no purged offset is served
after it. A proxy replays them too when its metadata has loaded (`newer_purges`): a purge record its metadata
lacks (another cluster's metadata topic, or a write that failed after the record) still moves what it serves.
"""

from __future__ import annotations

import base64
import json
import logging
from dataclasses import replace

from tierproxy.tier.cache import MetadataCache
from tierproxy.tier.model import RemoteLogStartOffset, TopicIdPartition, uuid_str
from tierproxy.tier.rlmm import ReplayedMetadata
from tierproxy.tier.serde import decode_value, encode_value, record_key
from tierproxy.tier.snapshot import TierSnapshot
from tierproxy.tier.storage import ObjectMissing, ObjectStore

log = logging.getLogger("tierproxy.tier")
PREFIX = "purges/"


def _key(prefix: str, name: str) -> str:
    return f"{prefix}/{name}" if prefix else name


def purge_key(prefix: str, tp: TopicIdPartition, log_start: int) -> str:
    return _key(prefix, f"{PREFIX}{uuid_str(tp.topic_id)}-{tp.partition}/{log_start:020d}.json")


async def record_purge(store: ObjectStore, prefix: str, event: RemoteLogStartOffset) -> None:
    """Write `event` (a purge about to be recorded in the metadata) into the tier, whole (one PUT)."""
    body = {"key": base64.b64encode(record_key(event)).decode(),
            "value": base64.b64encode(encode_value(event)).decode()}
    await store.put(purge_key(prefix, event.tp, event.log_start_offset), json.dumps(body).encode())


async def forget_purge(store: ObjectStore, prefix: str, tp: TopicIdPartition, log_start: int) -> None:
    """Best effort: the purge record of a purge whose metadata write was refused outright (its DeleteRecords is
    answered as not recorded); one left behind only moves the log start the client asked for."""
    try:
        await store.delete(purge_key(prefix, tp, log_start))
    except Exception as exc:
        log.warning("%s-%d: the purge record below %d could not be removed: %s", tp.topic, tp.partition, log_start,
                    exc)


async def recorded_purges(store: ObjectStore, prefix: str) -> list[tuple[bytes, bytes]]:
    """Every purge record in the tier as a metadata record (key, value), lowest log start first per partition.
    One that does not parse is skipped with a warning (a purge is written whole: it was never completed)."""
    out: list[tuple[int, bytes, bytes]] = []
    for key in await store.list(_key(prefix, PREFIX)):
        if not key.endswith(".json"):
            continue
        try:
            raw = json.loads(await store.get(key))
            k, v = base64.b64decode(raw["key"]), base64.b64decode(raw["value"])
            event = decode_value(v)
        except (ValueError, KeyError, ObjectMissing) as exc:
            log.warning("skipping purge record %s: %s", key, exc)
            continue
        if isinstance(event, RemoteLogStartOffset):
            out.append((event.log_start_offset, k, v))
    return [(k, v) for _, k, v in sorted(out)]


def newer_purges(cache: MetadataCache, purges: list[tuple[bytes, bytes]]) -> list[RemoteLogStartOffset]:
    """Of `purges` (`recorded_purges`), those that move the log start of a history `cache` holds, in order."""
    out = []
    for _, value in purges:
        event = decode_value(value)
        assert isinstance(event, RemoteLogStartOffset)
        pc = cache.get(event.tp.topic_id, event.tp.partition)
        if pc is not None and not cache.is_deleted(event.tp.topic_id, event.tp.partition) and \
                event.log_start_offset > pc.log_start_offset:
            out.append(event)
    return out


async def with_purges(store: ObjectStore, prefix: str, snap: TierSnapshot) -> TierSnapshot:
    """`snap` with the purge records its own records do not hold yet appended (recorded after its pass): what a
    restore replays then moves every such log start, in the plan and in the new cluster's metadata alike."""
    newer = newer_purges(ReplayedMetadata.of(snap.records).cache, await recorded_purges(store, prefix))
    for event in newer:
        log.warning("%s-%d: purged below %d after the snapshot %s (a purge record): replayed", event.tp.topic,
                    event.tp.partition, event.log_start_offset, snap.name)
    if not newer:
        return snap
    return replace(snap, records=[*snap.records, *((record_key(e), encode_value(e)) for e in newer)])
