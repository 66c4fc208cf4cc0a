"""Replacing a partition's first tier segments in a process of its own (to be killed -9 at a pause point), and what
the tier must look like whatever step it was killed at."""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tierproxy.config import TierSettings
from tierproxy.jobs.tiering.cluster import PartitionInfo
from tierproxy.jobs.tiering.compact import CompactionStep, CompactionSummary
from tierproxy.jobs.tiering.pauses import TIER_PAUSE_AT
from tierproxy.jobs.tiering.replace import delete_retired, joined, replace_group
from tierproxy.tier.model import RemoteLogSegmentMetadata, SegmentState
from tierproxy.tier.open import open_metadata
from tierproxy.tier.ownership import OWNER_OBJECT
from tierproxy.tier.rsm import LOG_EXT, IndexType, RemoteStorageManager

ROOT = Path(__file__).resolve().parents[2]


def compact(metadata: str, storage: str, topic: str, partition: int, configs: dict[str, str], *,
            map_bytes: int = 16 << 20, log_start: int | None = None) -> CompactionSummary:
    """The tier job's compaction step over one partition, its tasks run in this process (no Spark: a process
    that starts fast, to be killed), with the engine; then what was retired deleted at once (a delay of 0)."""
    import threading

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    def run(coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, loop).result()

    rlmm = open_metadata(metadata, "", writer=True)
    run(rlmm.start())
    rsm = RemoteStorageManager.from_uri(storage)
    pc = rlmm.cache.find(topic, partition)
    assert pc is not None
    part = PartitionInfo(topic, pc.tp.topic_id, partition, -1, 0)
    try:
        starts = {} if log_start is None else {(topic, partition): log_start}  # the broker's, when given
        summary = CompactionStep(rlmm, rsm, storage, map_bytes, run, None).run([part], {topic: configs}, {}, starts)
        run(delete_retired(rlmm, rsm, 0))
    finally:
        run(rsm.close())
        run(rlmm.close())
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        loop.close()
    return summary


async def replace_first(metadata: str, storage: str, topic: str, partition: int, count: int) -> None:
    """Replace the partition's first `count` served segments by one holding the same bytes (`replace.joined`),
    then delete what was retired at once (a delay of 0)."""
    rlmm = open_metadata(metadata, "", writer=True)
    await rlmm.start()
    rsm = RemoteStorageManager.from_uri(storage)
    try:
        pc = rlmm.cache.find(topic, partition)
        assert pc is not None
        group = list(pc.finished())[:count]
        await replace_group(rlmm, rsm, group, await joined(rsm, group))
        await delete_retired(rlmm, rsm, 0)
    finally:
        await rsm.close()
        await rlmm.close()


def killed_at(s: TierSettings, topic: str, point: str, tmp: Path, count: int = 2,
              configs: dict[str, str] | None = None) -> None:
    """`replace_first` (`configs` given: `compact`) in a process of its own, SIGKILLed once it reaches the pause
    point `point`."""
    marker = tmp / f"at-{point}-{time.monotonic_ns()}"
    what = json.dumps(configs) if configs is not None else str(count)
    cmd = [sys.executable, "-m", "tests.support.replacing", str(s.metadata), s.storage, topic, "0", what]
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, TIER_PAUSE_AT: f"{point}:{marker}"},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            if proc.poll() is not None:
                raise AssertionError(f"ended (rc {proc.returncode}) before {point}: {proc.stderr.read()!r}"
                                     if proc.stderr else point)
            assert time.monotonic() < deadline, f"never reached {point}"
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
        if proc.stderr:
            proc.stderr.close()


def served_as(s: TierSettings, topic: str, raw: bytes) -> list[RemoteLogSegmentMetadata]:
    """Asserts the tier serves every offset once, with the broker's very bytes (`raw`, its whole log): the served
    segments follow one another without overlap or hole, and their logs joined are `raw`. → the served segments."""
    from tests.support.tiering import tiered  # (not in the process to be killed: it starts faster without)

    segs, logs, _ = tiered(s, topic)
    for a, b in itertools.pairwise(segs):
        assert b.start_offset == a.end_offset + 1, (a, b)
    assert logs == raw
    return segs


def objects_against_metadata(s: TierSettings, topic: str) -> tuple[set[str], set[str], set[SegmentState]]:
    """(the segment objects in the file tier, those its metadata names: every segment in any state, and the states
    of the partition's segments)."""
    root = Path(s.storage.removeprefix("file://"))
    found = {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and not p.name.startswith(".tmp-")
             and p.name != OWNER_OBJECT and "snapshots" not in p.relative_to(root).parts}

    async def named() -> tuple[set[str], set[SegmentState]]:
        rlmm = open_metadata(s.metadata, "")
        await rlmm.start()
        rsm = RemoteStorageManager.from_uri(s.storage)
        try:
            pc = rlmm.cache.find(topic, 0)
            segs = list(pc.segments.values()) if pc else []
            return ({rsm.key(md, ext) for md in segs for ext in (LOG_EXT, *(i.value for i in IndexType))},
                    {md.state for md in segs})
        finally:
            await rsm.close()
            await rlmm.close()

    return found, *asyncio.run(named())


if __name__ == "__main__":
    args = argparse.ArgumentParser()
    for name in ("metadata", "storage", "topic", "partition", "what"):  # what: a count, or configs to compact
        args.add_argument(name)
    a = args.parse_args()
    if a.what.startswith("{"):
        compact(a.metadata, a.storage, a.topic, int(a.partition), json.loads(a.what))
    else:
        asyncio.run(replace_first(a.metadata, a.storage, a.topic, int(a.partition), int(a.what)))
