"""One RLMM bootstrap in a fresh process: prints seconds, records consumed, live segments and peak RSS (MiB)."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

from tierproxy.tier.rlmm_topic import TopicRLMM


def _hwm_kib() -> int:
    """Peak RSS of this process image (VmHWM; ru_maxrss would include the parent's peak from before exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise RuntimeError("no VmHWM")


async def main(bootstrap: str, topic: str, checkpoint: str | None) -> None:
    base = _hwm_kib()
    r = TopicRLMM(bootstrap, topic=topic, partitions=50, replication=1,
                  checkpoint_dir=Path(checkpoint) if checkpoint else None)
    r.deferring = True  # as the proxy's view (`remote.service`); a tree without it ignores it
    start = time.perf_counter()
    await r.start()
    elapsed = time.perf_counter() - start
    at_start = _hwm_kib()
    began = time.perf_counter()
    for pc in list(r.cache.partitions.values()):  # what a /metrics scrape asks of every partition (with
        pc.summary()  # `deferring`, every partition's records are applied here: the whole view made)
    scrape = time.perf_counter() - began
    live = sum(len(pc.segments) for pc in r.cache.partitions.values())
    if checkpoint and not any(Path(checkpoint).iterdir()):
        r.write_checkpoint()
    consumed = r.records_consumed
    r.checkpoint_dir = None  # keep the checkpoint as written above
    await r.close()
    peak = _hwm_kib()
    print(json.dumps({"seconds": elapsed, "consumed": consumed, "live": live, "rss_mib": peak / 1024,
                      "rss_before_mib": base / 1024, "rss_at_start_mib": at_start / 1024, "scrape_s": scrape}))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None))
