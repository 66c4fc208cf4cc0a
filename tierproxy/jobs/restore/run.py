"""`tierproxy restore`: the tier's history into a new cluster, every offset kept.

Steps, each one resumable (a rerun after kill -9 finds what is done and goes on; the state, `restore/<B's id>.json`
in the tier, is saved after every step that changes the new cluster, each group commit included):
1. choose the facts from the lost cluster's kept snapshots (`restore.plan.choose_facts`: each item from the newest
   snapshot that holds it whole; refused, naming them, when some are held by none, unless `accept_missing`) and
   copy them into the restore's state (`restore/<B's id>.facts.json`, its records beside it): a rerun, or a later
   stage for other topics hours later, plans from that copy, whatever the new cluster's own `tier` passes have
   pruned since. Plan every topic (`restore.plan`); refuse, changing nothing, what would lose or overwrite data
   (a topic an earlier run finished is the new cluster's now: accepted as it is, whatever its clients wrote since);
2. hand the tier to the new cluster (`tier.ownership.hand_over`: the lost cluster joins the lineage);
3. create the topics (recorded partition count and configs), raise their leader epochs (`restore.epochs`), fill
   and purge them to S (`restore.fill`), verify log start = high watermark = S;
4. write the snapshot's metadata records into the new cluster's metadata topic, then a mount per lost topic id
   (`TopicMount`: the restored topic's id there is an alias of the old id, so the same history continues);
5. commit the recorded group offsets (`restore.groups`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

from tierproxy.config import TierSettings
from tierproxy.jobs.restore.drill import DrillFindings, drill
from tierproxy.jobs.restore.epochs import partition_state, raise_epochs
from tierproxy.jobs.restore.fill import FillFailed, FillResult, ForeignRecords, fill_configs, fill_partition
from tierproxy.jobs.restore.groups import GroupsResult, Key, commit_groups, key_name
from tierproxy.jobs.restore.plan import (
    ChosenFacts,
    RestoreRefused,
    TargetPartition,
    TopicPlan,
    check_target,
    choose_facts,
    plan_topics,
    replay,
)
from tierproxy.jobs.tiering.cluster import ClusterView, admin_client, describe_cluster, list_offsets
from tierproxy.tier import snapshot as snapshots
from tierproxy.tier.cache import MetadataCache
from tierproxy.tier.model import NO_ALIAS, TopicMount, uuid_bytes, uuid_str
from tierproxy.tier.open import open_metadata
from tierproxy.tier.ownership import hand_over, recorded_owner, restore_finished
from tierproxy.tier.purges import with_purges
from tierproxy.tier.rsm import RemoteStorageManager
from tierproxy.tier.storage import ObjectMissing
from tierproxy.tier.transactions import lost_outcomes

log = logging.getLogger("tierproxy.jobs.restore")
T = TypeVar("T")
STATE_PREFIX = "restore/"
FILL_THREADS = 4


@dataclass
class RestoreReport:
    source_cluster: str
    target_cluster: str
    snapshot: str
    snapshot_taken_ms: int
    dry_run: bool
    partitions: list[dict[str, Any]] = field(default_factory=list)  # topic, partition, tier_end, start, lost, epoch
    groups: dict[str, Any] = field(default_factory=dict)
    filled_offsets: int = 0
    fill_seconds: float = 0.0
    leader_moves: int = 0
    done_ms: int = 0  # a restore found finished before (nothing done this time)
    finished_before: list[str] = field(default_factory=list)  # topics an earlier run restored: left as they are
    older: list[str] = field(default_factory=list)  # facts taken from an older snapshot than the last
    missing: list[str] = field(default_factory=list)  # facts no kept snapshot held (gone on without: accepted)
    drill: DrillFindings | None = None  # a dry run's reading of the tier (`restore.drill`)
    aborted_by_rule: list[str] = field(default_factory=list)  # open at the tier's end: aborted (tier.transactions)
    storage: str = ""  # the run's object-store requests and bytes (`tier.requests`)

    def lines(self) -> list[str]:
        earlier = [f"  restored by an earlier run, left as they are: {', '.join(self.finished_before)}"] \
            if self.finished_before else []
        if self.done_ms:
            return [f"the restore of cluster {self.source_cluster} into cluster {self.target_cluster} from tier "
                    f"snapshot {self.snapshot} finished at {self.done_ms} (ms): nothing to do", *earlier]
        out = [f"{'would restore' if self.dry_run else 'restored'} {len(self.partitions)} partitions of cluster "
               f"{self.source_cluster} into cluster {self.target_cluster} from tier snapshot {self.snapshot}"]
        out += earlier
        out += [f"  from an older pass: {line}" for line in self.older]
        out += [f"  NOT RECORDED in any kept pass, gone on without (--accept-missing): {line}" for line in self.missing]
        for p in self.partitions:
            lost = f"; LOST offsets {p['lost'][0]}..{p['lost'][1] - 1} (produced after the last pass)" \
                if p["lost"] else ""
            out.append(f"  {p['topic']}-{p['partition']}: tier 0..{p['tier_end'] - 1}, begins at {p['start']}, "
                       f"leader epoch above {p['min_epoch']}{lost}")
        if self.filled_offsets:
            rate = self.filled_offsets / self.fill_seconds if self.fill_seconds else 0.0
            out.append(f"  filled {self.filled_offsets} offsets in {self.fill_seconds:.1f}s ({rate:,.0f} offsets/s, "
                       f"{FILL_THREADS} partitions at a time); {self.leader_moves} leader moves")
        for key in ("committed", "kept", "active", "failed", "not_recorded"):
            if self.groups.get(key):
                out.append(f"  groups {key.replace('_', ' ')}: {self.groups[key]}")
        out += [f"  transaction open at the tier's end, its end lost with the cluster: ABORTED by rule: {t}"
                for t in self.aborted_by_rule]
        out += self.drill.lines() if self.drill else []
        out += [f"  {self.storage}"] if self.storage else []
        return out


def _run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def _all_mounted(state: dict[str, Any]) -> bool:
    """Whether every topic any run of this restore began is finished (its mounts written): only then may `tier`
    run on the new cluster (a stage killed mid-fill keeps it refused, whatever a later stage of other topics did)."""
    return set(state.get("topics", {})) <= set(state.get("finished", {}))


def _step(name: str) -> None:
    """Each step that changes the new cluster says so as it begins: an operator (and the chaos test, which kills
    the restore at each) sees where a run stopped."""
    log.info("restore: step %s", name)


def _progress(state: dict[str, Any] | None, snap: snapshots.TierSnapshot) -> tuple[dict[str, int], set[Key]]:
    """What earlier runs finished: topic → when, and the (group, topic, partition)s committed. A state of an earlier
    version said `done_ms` and whole groups (`groups_committed`): its topics with ids were finished then, and a
    committed group's offsets on them committed."""
    if state is None:
        return {}, set()
    if "finished" in state:
        done = {(g, t, int(p)) for g, t, p in (k.rsplit("/", 2) for k in state.get("groups_done", []))}
        return {t: int(ms) for t, ms in state["finished"].items()}, done
    finished = {t: int(state["done_ms"]) for t, tid in state.get("topics", {}).items()
                if tid and state.get("done_ms")}
    return finished, {(g, o.topic, o.partition) for g in state.get("groups_committed", [])
                      for o in snap.groups.get(g, []) if o.topic in state.get("topics", {})}


class Restore:
    """One restore of the tier at `settings.storage` into the cluster at `settings.own_bootstrap`."""

    def __init__(self, settings: TierSettings, pattern: str = ".*", dry_run: bool = False,
                 say: Callable[[str], None] = print, accept_missing: bool = False) -> None:
        self.s, self.pattern, self.dry_run, self.say = settings, pattern, dry_run, say
        self.accept_missing = accept_missing
        self.rsm = RemoteStorageManager.from_uri(settings.storage)

    def _state_key(self, cluster: str) -> str:
        return self.rsm.object_key(f"{STATE_PREFIX}{cluster}.json")

    async def _state(self, cluster: str) -> dict[str, Any] | None:
        try:
            return dict(json.loads(await self.rsm.store.get(self._state_key(cluster))))
        except ObjectMissing:
            return None

    async def _save(self, cluster: str, state: dict[str, Any]) -> None:
        await self.rsm.store.put(self._state_key(cluster), json.dumps(state, indent=1).encode())

    def run(self) -> RestoreReport:
        try:
            report = self._run()
            report.storage = self.rsm.store.counts.line()  # what this run asked of the object store
            return report
        finally:
            _run(self.rsm.close())

    def _run(self) -> RestoreReport:
        s = self.s
        view = describe_cluster(s.own_bootstrap, s.identity)
        target = view.cluster_id or ""
        state = _run(self._state(target))
        chosen = _run(self._facts(state, target if self.dry_run else None))
        snap = chosen.snapshot
        snap = _run(with_purges(self.rsm.store, self.rsm.prefix, snap))  # purges recorded since its pass
        owner = _run(recorded_owner(self.rsm))
        live = self.dry_run and snap.cluster_id == target  # a dry run against the tiered cluster itself: a drill
        if not live:
            self._check_owner(owner.cluster_id if owner else None, owner.lineage_ids if owner else [], snap, target)
        history = replay(snap)  # the tier's view from the snapshot alone
        plans = plan_topics(snap, history, self.pattern)
        restored = {plan.facts.name for plan in plans}
        missing = chosen.missing_for(restored)
        # what an earlier run was told to go on without; a later stage's new items are asked for again
        accepted = {tuple(k) for k in (state or {}).get("missing_accepted") or [] if isinstance(k, list)}
        unaccepted = [u for u in missing if (u.kind, u.name, u.partition) not in accepted]
        if unaccepted and not (live or self.accept_missing):
            raise RestoreRefused(
                f"no kept tier snapshot of cluster {snap.cluster_id} holds these whole (its passes could not read "
                f"them): {'; '.join(u.describe() for u in unaccepted)}; a restore now would go on without them (a "
                "partition's end, a group's offsets): run it with --accept-missing to do so")
        if live:
            return self._drill(snap, history, plans, view, [u.describe() for u in missing])
        if len(view.brokers) < 2:
            raise RestoreRefused(
                f"the cluster at {s.own_bootstrap} has one broker: a restored partition's leader epoch must rise "
                "above the history's, and only a leader move raises it (use a cluster of 2+ brokers, or the "
                "offline method in docs/restore.md)")
        ours = set((state or {}).get("topics", {}))
        finished, done = _progress(state, snap)
        todo = [plan for plan in plans if plan.facts.name not in finished]  # finished: B's now, as B left it
        pending = [k for g, offs in snap.groups.items() for o in offs
                   if o.topic in restored and (k := (g, o.topic, o.partition)) not in done]
        if state is not None and not todo and not pending:
            report = RestoreReport(snap.cluster_id, target, snap.name, snap.taken_ms, True)
            report.done_ms = int(state.get("done_ms") or max(finished.values(), default=0))
            report.finished_before = sorted(restored)
            if _all_mounted(state):  # a run killed after its last mounts, before it said so
                _run(restore_finished(self.rsm, target))
            return report  # finished before: the topics are B's now (clients may have written), nothing to redo
        existing = self._existing(view, todo)
        problems = [p for plan in todo if (p := check_target(plan, existing.get(plan.facts.name),
                                                             plan.facts.name in ours)) is not None]
        for plan in todo:
            for pp in plan.partitions:
                end = existing.get(plan.facts.name, {}).get(pp.partition, TargetPartition(0, 0)).high_watermark
                if pp.start - end > s.restore_fill_max_offsets:
                    problems.append(f"{pp.topic}-{pp.partition} needs {pp.start - end} offsets filled, more than "
                                    f"restore.fill.max.offsets={s.restore_fill_max_offsets}: use the offline "
                                    "method (docs/restore.md), or raise the bound")
        if problems:
            raise RestoreRefused("; ".join(problems))
        report = RestoreReport(snap.cluster_id, target, snap.name, snap.taken_ms, self.dry_run)
        report.partitions = [{**asdict(pp), "lost": pp.lost} for plan in todo for pp in plan.partitions]
        report.finished_before = sorted(restored & set(finished))
        report.older, report.missing = chosen.older, [u.describe() for u in missing]
        report.groups["not_recorded"] = snap.groups_unreadable or ""
        if self.dry_run:
            report.drill = _run(drill(self.rsm, history, todo, None, report.missing, snap.taken_ms,
                                      int(time.time() * 1000)))
            return report

        if state is None or "facts" not in state:  # pinned before anything changes: every later run plans from it
            _run(snapshots.pin(self.rsm.store, self.rsm.prefix, f"{STATE_PREFIX}{target}.facts.json", snap))
        state = state or {"source": snap.cluster_id, "snapshot": snap.name, "started_ms": int(time.time() * 1000),
                          "topics": {}}
        state["facts"] = f"{STATE_PREFIX}{target}.facts.json"
        state["missing_accepted"] = sorted(accepted | {(u.kind, u.name, u.partition) for u in missing})
        state["finished"], state["groups_done"] = finished, sorted(key_name(k) for k in done)
        state["topics"].update({plan.facts.name: state["topics"].get(plan.facts.name) for plan in todo})
        state.pop("done_ms", None)  # this run's topics are not done until it ends
        state.pop("groups_committed", None)  # format of earlier versions: read into `groups_done` above
        _run(self._save(target, state))
        if todo:
            self._topics(report, state, snap, history, todo, existing, target)
        if _all_mounted(state):  # every topic this restore began has its mounts: `tier` passes on B may run
            _run(restore_finished(self.rsm, target))

        def saved(keys: list[Key]) -> None:  # after each group's commit: a kill never commits it again
            state["groups_done"] = sorted({*state["groups_done"], *map(key_name, keys)})
            _run(self._save(target, state))

        view = describe_cluster(s.own_bootstrap, s.identity)
        _step("groups")
        groups: GroupsResult = commit_groups(s.own_bootstrap, list(view.brokers.values()), snap.groups, restored,
                                             s.identity, done, saved)
        report.groups.update(committed=groups.committed, kept=groups.kept, active=groups.active,
                             failed=groups.failed)
        if not groups.failed:
            state["done_ms"] = int(time.time() * 1000)
        _run(self._save(target, state))
        return report

    def _drill(self, snap: snapshots.TierSnapshot, history: MetadataCache, plans: list[TopicPlan],
               view: ClusterView, missing: list[str]) -> RestoreReport:
        """The dry run against the tiered cluster itself: what a restore now would lose, [N, its end now)."""
        names = {plan.facts.name for plan in plans}
        ends = list_offsets(view, [p for p in view.partitions if p.topic in names])
        found = _run(drill(self.rsm, history, plans, {k: o.high_watermark for k, o in ends.items()}, missing,
                           snap.taken_ms, int(time.time() * 1000)))
        report = RestoreReport(snap.cluster_id, snap.cluster_id, snap.name, snap.taken_ms, True, drill=found,
                               missing=missing)
        for plan in plans:
            for pp in plan.partitions:
                lost = found.lost.get((pp.topic, pp.partition))
                report.partitions.append({**asdict(pp), "start": lost[1] if lost else pp.start, "lost": lost})
        return report

    def _topics(self, report: RestoreReport, state: dict[str, Any], snap: snapshots.TierSnapshot,
                history: MetadataCache, plans: list[TopicPlan], existing: dict[str, dict[int, TargetPartition]],
                target: str) -> None:
        """Steps 2-4 for the topics not finished yet; each marked finished in the state once its mounts exist."""
        s, owner = self.s, _run(recorded_owner(self.rsm))
        view = describe_cluster(s.own_bootstrap, s.identity)
        _step("hand-over")
        _run(hand_over(self.rsm, owner, target, snap.cluster_id))  # says a restore is in progress: no `tier` pass
        _step("create")
        self._create(view, plans, existing)
        floors = {(pp.topic, pp.partition): pp.min_epoch for plan in plans for pp in plan.partitions}
        _step("epochs")
        report.leader_moves = raise_epochs(s.own_bootstrap, floors, s.identity)
        _step("fill")
        fills = self._fill(plans)
        report.filled_offsets = sum(f.filled for f in fills)
        report.fill_seconds = max((f.seconds for f in fills), default=0.0)
        view = describe_cluster(s.own_bootstrap, s.identity)
        ids = {p.topic: p.topic_id for p in view.partitions}
        state["topics"].update({plan.facts.name: uuid_str(ids[plan.facts.name]) for plan in plans})
        _run(self._save(target, state))
        _step("verify")
        self._verify(plans)
        self._own_policies(plans)
        _step("metadata")
        report.aborted_by_rule = _run(self._metadata(snap, history, plans, ids, target))
        now = int(time.time() * 1000)
        state["finished"].update({plan.facts.name: now for plan in plans})
        _run(self._save(target, state))

    async def _facts(self, state: dict[str, Any] | None, drilled: str | None = None) -> ChosenFacts:
        """The facts to plan from: a rerun's or a later stage's, the copy its first run pinned (never a snapshot
        the new cluster wrote since); a first run's, chosen from the lost cluster's kept snapshots; a dry run's
        against a cluster the tier has snapshots of (`drilled`: the drill), that cluster's own — unless a restore
        into it has topics of the pattern left to restore (a dry run of its next stage plans from the pinned facts)."""
        pinned = None
        if state is not None:
            name = state.get("facts") or state["snapshot"]  # no "facts": an earlier version's
            key = self.rsm.object_key(name)
            try:
                pinned = await snapshots.read(self.rsm.store, self.rsm.prefix, name)
            except (ObjectMissing, ValueError) as exc:
                raise RestoreRefused(f"the facts this restore began from ({key}) are gone: {exc}") from None
        rx = re.compile(self.pattern)
        stage_left = pinned is not None and any(rx.fullmatch(t) and t not in (state or {}).get("finished", {})
                                                for t in pinned.topics)
        if drilled is not None and not stage_left and \
                (own := await snapshots.of_cluster(self.rsm.store, self.rsm.prefix, drilled)):
            return choose_facts(own)
        if pinned is not None:
            return choose_facts([pinned])
        snaps = await snapshots.of_cluster(self.rsm.store, self.rsm.prefix)
        if not snaps:
            raise RestoreRefused(f"the tier at {self.s.storage} holds no snapshot (a `tier` pass of this version "
                                 "writes one): nothing says what its segments are")
        return choose_facts(snaps)

    def _check_owner(self, owner: str | None, lineage: list[str], snap: snapshots.TierSnapshot, target: str) -> None:
        if snap.cluster_id == target:
            raise RestoreRefused(f"the tier's snapshot is of cluster {target}, the cluster at {self.s.own_bootstrap}"
                                 ": it is not lost, nothing to restore")
        if owner is None or owner == snap.cluster_id:
            return
        if owner == target and snap.cluster_id in lineage:
            return  # a rerun of this restore
        raise RestoreRefused(f"the tier belongs to cluster {owner} now (restored from {', '.join(lineage) or '?'}), "
                             f"not to the snapshot's cluster {snap.cluster_id}: refusing a second restore onto "
                             f"cluster {target}")

    def _existing(self, view: ClusterView, plans: list[TopicPlan]) -> dict[str, dict[int, TargetPartition]]:
        names = {plan.facts.name for plan in plans}
        parts = [p for p in view.partitions if p.topic in names]
        offs = list_offsets(view, parts)
        out: dict[str, dict[int, TargetPartition]] = {}
        for p in parts:
            o = offs.get((p.topic, p.partition))
            if o is None:
                raise RestoreRefused(f"{p.topic}-{p.partition} exists in the new cluster but its offsets cannot be "
                                     "read (no leader?): retry when it has one")
            out.setdefault(p.topic, {})[p.partition] = TargetPartition(o.log_start, o.high_watermark)
        return out

    def _create(self, view: ClusterView, plans: list[TopicPlan], existing: dict[str, Any]) -> None:
        missing = [plan.facts for plan in plans if plan.facts.name not in existing]
        if not missing:
            return

        async def create() -> None:
            from aiokafka.admin import NewTopic

            async with admin_client(self.s.own_bootstrap, self.s.identity) as admin:
                rf = len(view.brokers)
                topics = [NewTopic(f.name, f.partitions, max(2, min(f.replication_factor, rf)),
                                   topic_configs=fill_configs(f.configs)) for f in missing]
                resp = await admin.create_topics(topics)
                for name, code, *rest in getattr(resp, "topic_errors", []):
                    if code not in (0, 36):  # 36 TOPIC_ALREADY_EXISTS: a rerun
                        raise RestoreRefused(f"creating topic {name} in the new cluster: error {code} {rest[:1]}")

        _run(create())
        names = [f.name for f in missing]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # until every partition has a leader
            state = partition_state(self.s.own_bootstrap, names, self.s.identity)
            if sum(f.partitions for f in missing) == len([v for v in state.values() if v[0] >= 0]):
                return
            time.sleep(0.2)
        raise RestoreRefused(f"the new topics {names} have no leaders after 30s")

    def _own_policies(self, plans: list[TopicPlan]) -> None:
        """The compacted topics, filled under `cleanup.policy=delete` (`fill.fill_configs`), get their recorded
        configs back, the policy with them (AlterConfigs with the whole set the topic was created with; a rerun
        sets the same again)."""
        compacted = [plan.facts for plan in plans if fill_configs(plan.facts.configs) != plan.facts.configs]
        if not compacted:
            return

        async def alter() -> None:
            from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

            async with admin_client(self.s.own_bootstrap, self.s.identity) as admin:
                for resp in await admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, f.name, f.configs)
                                                       for f in compacted]):
                    for code, message, _, name in resp.resources:
                        if code:
                            raise RestoreRefused(f"setting the recorded configs of {name} (cleanup.policy): "
                                                 f"error {code} {message}")

        _run(alter())

    def _fill(self, plans: list[TopicPlan]) -> list[FillResult]:
        jobs = [(pp.topic, pp.partition, pp.start) for plan in plans for pp in plan.partitions]
        with ThreadPoolExecutor(FILL_THREADS, thread_name_prefix="tierproxy-fill") as pool:
            return [f.result() for f in [pool.submit(self._fill_one, *job) for job in jobs]]

    def _fill_one(self, topic: str, partition: int, start: int) -> FillResult:
        """One partition's fill at its leader as the cluster names it now; a leader that moved (or a broker whose
        view trails) costs a retry at the leader named then: the fill goes on from the partition's end."""
        delay, last = 0.2, None
        for _ in range(6):
            view = describe_cluster(self.s.own_bootstrap, self.s.identity)
            p = next((p for p in view.partitions if (p.topic, p.partition) == (topic, partition)), None)
            if p is not None and p.leader >= 0:
                try:
                    return fill_partition(view.leader_address(p), topic, partition, start,
                                          self.s.restore_fill_batch_records, self.s.identity)
                except ForeignRecords:
                    raise  # not retried: a retry would purge what the other writer wrote
                except (FillFailed, OSError) as exc:
                    last = exc
            time.sleep(delay)
            delay = min(delay * 2, 3.0)
        raise FillFailed(f"{topic}-{partition}: not filled to {start}: {last}")

    def _verify(self, plans: list[TopicPlan]) -> None:
        """Log start = high watermark = S and the epoch above the history's, as the leaders answer. A broker's view
        may trail the controller's for a moment (a leader just moved): asked again, bounded, before giving up."""
        names = {plan.facts.name for plan in plans}
        wrong: list[str] = []
        delay = 0.1
        for _ in range(12):
            view = describe_cluster(self.s.own_bootstrap, self.s.identity)
            parts = {(p.topic, p.partition): p for p in view.partitions if p.topic in names}
            offs = list_offsets(view, list(parts.values()))
            wrong = [f"{pp.topic}-{pp.partition}: {offs.get((pp.topic, pp.partition))}, leader epoch "
                     f"{parts[(pp.topic, pp.partition)].leader_epoch if (pp.topic, pp.partition) in parts else '?'}"
                     for plan in plans for pp in plan.partitions
                     if (o := offs.get((pp.topic, pp.partition))) is None or (pp.topic, pp.partition) not in parts
                     or (o.log_start, o.high_watermark) != (pp.start, pp.start)
                     or parts[(pp.topic, pp.partition)].leader_epoch <= pp.min_epoch]
            if not wrong:
                return
            time.sleep(delay)
            delay = min(delay * 2, 3.0)
        raise FillFailed(f"after the fill, expected log start = high watermark = S and the epoch above the "
                         f"history's; found {'; '.join(wrong[:3])}")

    async def _metadata(self, snap: snapshots.TierSnapshot, history: MetadataCache, plans: list[TopicPlan],
                        ids: dict[str, bytes], target: str) -> list[str]:
        """Writes the history's metadata, the transactions aborted by rule and the mounts into B's metadata topic;
        returns the transactions aborted by rule, as the report names them."""
        s = self.s
        rlmm = open_metadata(s.metadata, s.own_bootstrap, None, s.identity, writer=True)
        await rlmm.start()
        try:
            await rlmm.catch_up()
            restored = {plan.origin_id: ids[plan.facts.name] for plan in plans}
            origins = {uuid_bytes(f.topic_id): f.name for f in snap.topics.values()}
            origins.update({tid: pc.tp.topic for (tid, _), pc in history.partitions.items()})
            now = int(time.time() * 1000)
            mounts = [TopicMount(name, tid, restored.get(tid, NO_ALIAS), snap.cluster_id, target, now)
                      for tid, name in sorted(origins.items())]
            # what this cluster's metadata already has (an earlier run's, and what its tier job did since) stays
            if unknown := rlmm.unknown_records(snap.records):
                await rlmm.put_records(unknown)
            # transactions the lost cluster never decided in the tier: aborted, once, by rule (tier.transactions)
            resolved = [o for plan in plans for pp in plan.partitions
                        if (pc := history.get(plan.origin_id, pp.partition)) is not None
                        for o in await lost_outcomes(pc, self.rsm, now)]
            await rlmm.put_outcomes(resolved)
            for o in resolved:
                log.warning("%s-%d: the transaction of producer %d from offset %d was open at the tier's end, its "
                            "end lost with cluster %s: aborted (read_committed readers never see its records)",
                            o.tp.topic, o.tp.partition, o.producer_id, o.first_offset, snap.cluster_id)
            changed = [m for m in mounts if (old := rlmm.cache.mounts.get(m.origin_id)) is None
                       or (old.alias_id != m.alias_id and m.mounted)]
            if changed:
                await rlmm.put_mounts(changed)  # last: a mount says the history under it is complete
        finally:
            await rlmm.close()
        return [f"{o.tp.topic}-{o.tp.partition} producer {o.producer_id} from offset {o.first_offset}"
                for o in resolved]
