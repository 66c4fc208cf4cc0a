"""Where the suite's wall time went, from the spans tests/conftest.py writes (.pytest-artifacts/timeline-*.tsv):
each worker's busy time and last finish, and the heaviest groups (a module or package sharing parts on one worker;
ungrouped tests by module)."""

from __future__ import annotations

import collections
import sys
from pathlib import Path


def main(folder: Path) -> None:
    rows = []
    for path in sorted(folder.glob("timeline-*.tsv")):
        for line in path.read_text().splitlines():
            start, end, worker, group, nodeid = line.split("\t", 4)
            rows.append((float(start), float(end), worker, group, nodeid))
    if not rows:
        print("no timeline")
        return
    t0 = min(r[0] for r in rows)
    busy: dict[str, float] = collections.defaultdict(float)
    last: dict[str, float] = collections.defaultdict(float)
    weight: dict[str, float] = collections.defaultdict(float)
    where: dict[str, set[str]] = collections.defaultdict(set)
    for start, end, worker, group, nodeid in rows:
        busy[worker] += end - start
        last[worker] = max(last[worker], end - t0)
        key = group or nodeid.split("::")[0].split("@")[0]
        weight[key] += end - start
        where[key].add(worker)
    for worker in sorted(busy):
        print(f"{worker}: busy {busy[worker] / 60:.1f} min, last test ended at {last[worker] / 60:.1f} min")
    print("heaviest groups (seconds, workers):")
    for key, seconds in sorted(weight.items(), key=lambda kv: -kv[1])[:25]:
        print(f"  {seconds:7.1f}  {','.join(sorted(where[key]))}  {key}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else ".pytest-artifacts"))
