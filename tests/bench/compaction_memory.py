"""Peak memory of one compaction task: a partition of distinct keys written into a file tier as the tier job
writes its copies (batches of the tier's indexes, `build_segment`; COPY_SEGMENT_STARTED, the objects, then
FINISHED), and the compaction step run over it in a fresh process (`python -m tests.bench.compaction_memory`),
its task wrapped to measure the process's resident set: its peak during the task (VmHWM, reset just before the
task through /proc/self/clear_refs) minus its resident set before."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from protocol.records import Record, build_batch
from tierproxy.tier.indexes import build_segment
from tierproxy.tier.model import RemoteLogSegmentMetadata, SegmentState, TopicIdPartition
from tierproxy.tier.open import open_metadata
from tierproxy.tier.rlmm import new_segment
from tierproxy.tier.rsm import RemoteStorageManager

ROOT = Path(__file__).resolve().parents[2]


def segment_bytes(keys: int, per_batch: int, batches_per_segment: int, ts: int, start: int) -> bytes:
    out = bytearray()
    for b in range(batches_per_segment):
        base = start + b * per_batch
        n = min(per_batch, keys - base)
        if n <= 0:
            break
        out += build_batch([Record(base + i, ts, b"k%09d" % (base + i), b"v%07d" % (base + i)) for i in range(n)],
                           base_offset=base)
    return bytes(out)


async def write_tier(metadata: str, storage: str, topic: str, keys: int, *, per_batch: int = 2000,
                     batches_per_segment: int = 250) -> tuple[int, int]:
    """`keys` records of distinct keys at offsets 0..keys-1 (an hour old) as tier segments of `batches_per_segment`
    batches of `per_batch` records; → (bytes written, segments)."""
    rlmm = open_metadata(metadata, "", writer=True)
    await rlmm.start()
    rsm = RemoteStorageManager.from_uri(storage)
    tp = TopicIdPartition(topic, os.urandom(16), 0)
    ts = int(time.time() * 1000) - 3_600_000
    total = segments = 0
    try:
        for start in range(0, keys, per_batch * batches_per_segment):
            raw = segment_bytes(keys, per_batch, batches_per_segment, ts, start)
            files = build_segment(raw)
            md = new_segment(tp, os.urandom(16), files.start_offset, files.end_offset, ts, {0: files.start_offset},
                             len(raw))
            await rlmm.add_segments([md])
            await rsm.copy_segment(md, files)
            await rlmm.finish_copy(RemoteLogSegmentMetadata(
                md.segment_id, files.start_offset, files.end_offset, ts, -1, 0, {0: files.start_offset}, len(raw),
                SegmentState.COPY_SEGMENT_FINISHED, files.txn_index_empty))
            total += len(raw)
            segments += 1
    finally:
        await rsm.close()
        await rlmm.close()
    return total, segments


def _status(key: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    raise AssertionError(key)


def measured_task(original: Any, out: str, task: Any) -> Any:
    """`original` (`compact.compact_task`), with the resident set of the process running it before it and its peak
    during it (MiB) and the task's wall and CPU seconds appended to the file `out` as one JSON line (the process
    may be a Spark worker's)."""
    before = _status("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM back to the current resident set
    wall, cpu = time.perf_counter(), time.thread_time()
    result = original(task)
    figures = {"rss_before_mib": before, "peak_mib": _status("VmHWM"), "wall_s": time.perf_counter() - wall,
               "cpu_s": time.thread_time() - cpu, "error": result.error,
               "bytes_in": sum(s.size for s in result.task.plan.segments),
               # the end of what the cleaning covered (the key map may fill before the plan's end)
               "cleaned_to": max((c.segment.end_offset for c in result.cleaned if c.segment.was_cleaned), default=-1),
               "end": max(s.end_offset for s in result.task.plan.segments)}
    with open(out, "a") as f:
        f.write(json.dumps(figures) + "\n")
    return result


def compact_in_a_fresh_process(metadata: str, storage: str, topic: str, map_bytes: int,
                               configs: dict[str, str]) -> dict[str, Any]:
    """One pass of the compaction step (its task in the same process: no Spark) → the task's figures and the
    step's summary."""
    out = Path(metadata.removeprefix("file://")).parent / f"task-{time.monotonic_ns()}.json"
    args = [sys.executable, "-m", "tests.bench.compaction_memory", metadata, storage, topic, str(map_bytes),
            json.dumps(configs), str(out)]
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert out.exists(), f"no compaction task ran (nothing to clean?): {done.stdout[-2000:]}"
    task = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(task) == 1, task
    return {**task[0], "summary": json.loads(done.stdout.strip().splitlines()[-1])}


def _main(metadata: str, storage: str, topic: str, map_bytes: str, configs: str, out: str) -> None:
    import dataclasses

    from tests.support.replacing import compact
    from tierproxy.jobs.tiering import compact as step

    # the step looks its task function up when it runs its tasks
    setattr(step, "compact_task", functools.partial(measured_task, step.compact_task, out))  # noqa: B010
    summary = compact(metadata, storage, topic, 0, json.loads(configs), map_bytes=int(map_bytes))
    print(json.dumps(dataclasses.asdict(summary)))


if __name__ == "__main__":
    _main(*sys.argv[1:7])
