"""The Kafka Streams restore through the proxy, end to end, at any size (the suite's test and the benchmark run the
same steps; tests/streams/test_ktable_restore.py tells the story):

1. updates and tombstones are produced to an input topic, all but the last tenth an hour old;
2. TableApp (`tests.support.streams`) builds its KTable from the whole input, straight from the broker; its
   changelog is `cleanup.policy=compact,delete` with small segments, set through Streams' topic configs, with a
   retention and a compaction lag longer than the records' age: nothing is cleaned or deleted yet;
3. (benchmark) the instance's state is wiped and restored from the broker, which still holds everything: the
   baseline;
4. a tier pass copies the changelog as the broker holds it;
5. time passes, which the test stands in for by lowering the changelog's configs as they would be in a running
   estate: the broker keeps the last ten minutes (retention.ms): every changelog partition's log start moves, and
   what the broker still holds lacks many keys' latest values; then min.compaction.lag.ms goes to 0;
6. the next tier pass compacts the changelog's tiered history, which the broker no longer holds (the tier's own
   compaction step, Kafka's LogCleaner rules);
7. the state is wiped and the app starts again with a proxy as its bootstrap: Streams restores each changelog
   partition from below the broker's log start, reading the tier's compacted segments, and its store equals the
   whole input's table, key by key."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.kafka import create_topic, set_topic_config, watermarks
from tests.support.proxy import ProxyProcess
from tests.support.streams import (
    Restore,
    TableApp,
    changelog_of,
    final_state,
    latest_by_key,
    produce_updates,
    table_updates,
)
from tests.support.tiering import settings, tier_once
from tests.support.waiting import proxy_serves_tier, wait_until
from tierproxy.config import TierSettings
from tierproxy.jobs.tiering.job import RunSummary

HOUR_MS = 3_600_000
KEEP_MS = 600_000  # what the broker keeps of the changelog in the end: the last ten minutes


@dataclass(frozen=True)
class Size:
    updates: int
    keys: int
    partitions: int
    segment_bytes: int  # the broker's changelog segments
    tier_segment_bytes: int
    heap: str = "256m"  # each Streams JVM's
    timeout: float = 120  # each Streams phase's


@dataclass
class Outcome:
    """What the run measured (seconds, counts) and its tier passes."""
    figures: dict[str, float] = field(default_factory=dict)
    copied: RunSummary | None = None  # the tier pass that copied the changelog
    compacted: RunSummary | None = None  # the one that compacted it
    restores: list[Restore] = field(default_factory=list)


def changelog_configs(size: Size) -> dict[str, str]:
    """The changelog's configs as Streams creates it: compacted and deleted by time, small segments (many for the
    broker to delete). Its retention and compaction lag start longer than the records' age, so that the broker
    neither deletes nor cleans anything before the tier has copied it: a cleaner would group the hour-old segments
    with the last minutes' (as few segments as fit in segment.bytes), and a group's newest record would keep its
    older ones from time retention."""
    return {"cleanup.policy": "compact,delete", "retention.ms": str(3 * HOUR_MS),
            "min.compaction.lag.ms": str(2 * HOUR_MS), "internal.segment.bytes": str(size.segment_bytes)}


def _tier_pass(s: TierSettings) -> tuple[RunSummary, float]:
    began = time.perf_counter()
    summary = tier_once(s)
    assert summary.failed == 0 and summary.gaps == [] and not summary.errors, summary
    return summary, time.perf_counter() - began


def _same(state: dict[str, str], expected: dict[str, str], where: str) -> None:
    wrong = sorted(k for k in expected.keys() | state.keys() if state.get(k) != expected.get(k))
    assert not wrong, (f"restored from {where}: {len(wrong)} of {len(expected)} keys differ, e.g. "
                       + ", ".join(f"{k}: {state.get(k)!r} (expected {expected.get(k)!r})" for k in wrong[:5]))


def restore_through_the_proxy(bootstrap: str, workdir: Path, name: str, size: Size, *,
                              baseline: bool = False) -> Outcome:
    """The steps above (3 with `baseline`), asserting each; their figures."""
    out = Outcome()
    app_id, source = f"{name}-app", f"{name}-in"
    changelog = changelog_of(app_id)
    create_topic(bootstrap, source, size.partitions)
    updates = table_updates(size.updates, size.keys)
    expected = final_state(updates)
    # Streams gives each changelog record its input's timestamp: time retention will delete the hour-old part
    now, recent = int(time.time() * 1000), size.updates * 9 // 10
    began = time.perf_counter()
    produce_updates(bootstrap, source, updates, [now - HOUR_MS if i < recent else now for i in range(size.updates)])
    out.figures["produce_s"] = time.perf_counter() - began

    app = TableApp(workdir, app_id, source, size.partitions, changelog_configs(size), heap=size.heap)
    began = time.perf_counter()
    app.build(bootstrap)
    try:
        wait_until(lambda: app.caught_up(bootstrap), "the app's commit of the whole input", timeout=size.timeout,
                   interval=0.3)
        out.figures["build_s"] = time.perf_counter() - began
    finally:
        app.stop()  # (its log in the failure when it had ended)
    ends = [watermarks(bootstrap, changelog, p)[1] for p in range(size.partitions)]
    out.figures["changelog_offsets"] = sum(ends)

    if baseline:  # the same restore from the broker while it holds the whole changelog
        app.wipe()
        began = time.perf_counter()
        state, restores = app.dump(bootstrap, timeout=size.timeout)
        out.figures["broker_restore_s"] = time.perf_counter() - began
        out.figures["broker_restored_records"] = sum(r.records for r in restores)
        _same(state, expected, "the broker")

    s = settings(bootstrap, workdir, changelog, tier_segment_bytes=size.tier_segment_bytes)
    out.copied, out.figures["copy_pass_s"] = _tier_pass(s)
    assert out.copied.segments >= size.partitions, f"the tier copied {out.copied.segments} segments of the changelog"

    # an hour passes: the broker keeps the last ten minutes (before the input's last tenth came, however long the
    # steps took since)
    set_topic_config(bootstrap, changelog, "retention.ms", str(int(time.time() * 1000) - now + KEEP_MS))

    def broker_starts() -> list[int] | None:
        got = [watermarks(bootstrap, changelog, p)[0] for p in range(size.partitions)]
        return got if all(got) else None

    starts = wait_until(broker_starts, "the broker's time retention on every changelog partition", timeout=60)
    held = latest_by_key(bootstrap, changelog, size.partitions)
    lost = [k for k in expected if k not in held]  # keys whose latest value only the tier still holds
    assert len(lost) > len(expected) // 10, (len(lost), len(expected), starts)

    # and every record is past the compaction lag: the tier compacts the history the broker no longer holds
    set_topic_config(bootstrap, changelog, "min.compaction.lag.ms", "0")
    out.compacted, out.figures["compaction_pass_s"] = _tier_pass(s)
    done = out.compacted.compaction
    assert done.get("partitions") == size.partitions and done["failed"] == 0, done
    assert done["bytes_after"] < done["bytes_before"] // 2, done

    app.wipe()
    proxy = ProxyProcess(bootstrap, workdir, {"TIERPROXY_STORAGE": s.storage, "TIERPROXY_METADATA": s.metadata})
    try:
        wait_until(lambda: proxy_serves_tier(proxy.bootstrap, changelog, size.partitions), "the proxy's tier",
                   timeout=60)
        began = time.perf_counter()
        state, out.restores = app.dump(proxy.bootstrap, timeout=size.timeout)
        out.figures["proxy_restore_s"] = time.perf_counter() - began
    finally:
        proxy.stop()
    out.figures["proxy_restored_records"] = sum(r.records for r in out.restores)
    _same(state, expected, "the proxy")
    # ... from the tier's compacted segments (the changelog held an offset per update)
    assert out.figures["proxy_restored_records"] < sum(ends) // 2, (out.figures, ends)
    # each partition restored from below the broker's log start (the tier's part) to the changelog's end
    assert [(r.partition, r.end) for r in out.restores] == list(enumerate(ends)), out.restores
    assert all(r.start < start for r, start in zip(out.restores, starts, strict=True)), (out.restores, starts)
    out.figures.update(keys=len(expected), lost_on_broker=len(lost))
    return out
