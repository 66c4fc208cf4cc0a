"""A year of passes, compressed: a growing topic tiered and tabled pass after pass (small-file compaction on, at its
defaults), the table maintained by its own properties at Iceberg's defaults. Reports bytes on disk against the live
table, snapshots and manifests every 25 passes, and checks that every snapshot kept (the time travel configured)
still reads whole.

The year is compressed in time too: 500 passes stand for a year (one per 17.5 h), so the properties that are ages
are Iceberg's defaults scaled by the same factor — `history.expire.max-snapshot-age-ms` (5 days) is the real time of
6.85 passes (measured over the 2nd to 5th), `iceberg.orphan.min.age.ms` (1 h) that of 0.057 of a pass; the counts
(`history.expire.min-snapshots-to-keep` 1, `commit.manifest.min-count-to-merge` 100) are the defaults as they are.

    pytest -m bench tests/bench/test_iceberg_maintenance_bench.py -s
    (TIERPROXY_BENCH_MAINT_PASSES, default 500; TIERPROXY_BENCH_MAINT_RECORDS per pass, default 2000 of 200 B)
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import Any

import pytest

from tests.bench.report import report
from tests.support.iceberg import reads_whole
from tests.support.kafka import create_topic, fill_topic
from tests.support.spark import local_session, tier_once
from tierproxy.dev.kafkadist import KafkaCluster
from tierproxy.jobs.iceberg.catalog import catalog_config, open_catalog
from tierproxy.jobs.iceberg.manifests import figures
from tierproxy.jobs.iceberg.sync import IcebergOptions, IcebergSync

pytestmark = [pytest.mark.bench, pytest.mark.kafka, pytest.mark.spark]
PASSES = int(os.environ.get("TIERPROXY_BENCH_MAINT_PASSES", "500"))
RECORDS = int(os.environ.get("TIERPROXY_BENCH_MAINT_RECORDS", "2000"))
PASS_MS = 365 * 86_400_000 / 500  # what one pass stands for
DAY_MS = 86_400_000


def test_a_year_of_passes_keeps_disk_snapshots_and_manifests_bounded(kafka: KafkaCluster, tmp_path: Path) -> None:
    topic = "bench-maintenance"
    create_topic(kafka.bootstrap, topic)
    storage, metadata = f"file://{tmp_path}/tier", f"file://{tmp_path}/meta"
    cfg = catalog_config(None, storage, str(tmp_path / "state"))
    options = IcebergOptions(cfg, "bench.grow", kafka.bootstrap, storage, metadata, topic, read_committed=True)
    spark = local_session()
    lines: list[str] = []
    worst = 0.0
    peak_snapshots = peak_manifests = 0
    started = time.monotonic()
    took: list[float] = []
    for n in range(1, PASSES + 1):
        t0 = time.monotonic()
        fill_topic(kafka.bootstrap, topic, RECORDS)
        tier_once(kafka.bootstrap, topic, storage, metadata, tmp_path, segment_bytes=256 << 10)
        IcebergSync(options, lambda: spark).run_once()
        took.append(time.monotonic() - t0)
        table: Any = open_catalog(cfg).load_table("bench.grow")
        if n == 5:  # the ages scaled to the compressed year (module docstring)
            per_pass_ms = sum(took[1:]) / len(took[1:]) * 1000  # (the first one warms Spark up)
            scale = per_pass_ms / PASS_MS
            with table.transaction() as tx:
                tx.set_properties({"history.expire.max-snapshot-age-ms": str(int(5 * DAY_MS * scale))})
            options = dataclasses.replace(options, orphan_min_age_ms=int(3_600_000 * scale))
            lines.append(f"5 days = {5 * DAY_MS * scale / 1000:.1f} s, 1 h = {3_600_000 * scale / 1000:.2f} s "
                         f"({per_pass_ms / 1000:.1f} s a pass)")
        f = figures(table)
        peak_snapshots, peak_manifests = max(peak_snapshots, f["snapshots"]), max(peak_manifests, f["manifests"])
        if n > 25:  # (the first passes hold the replaced files of the first compactions within the age)
            worst = max(worst, f["disk_bytes"] / f["live_bytes"])
        if n % 25 == 0 or n == PASSES:
            lines.append(f"pass {n}: live {f['live_bytes'] / 1e6:.1f} MB, disk {f['disk_bytes'] / 1e6:.1f} MB = "
                         f"{f['disk_bytes'] / f['live_bytes']:.2f}x, {f['snapshots']} snapshots, "
                         f"{f['manifests']} manifests, {took[-1]:.1f} s")
            print(lines[-1], flush=True)
            reads_whole(table)  # every snapshot kept (the time travel) reads whole
    seconds = time.monotonic() - started
    final = figures(open_catalog(cfg).load_table("bench.grow"))
    ratio = final["disk_bytes"] / final["live_bytes"]
    report("iceberg maintenance", f"{PASSES} passes of {RECORDS} x 200 B (compaction on, default properties, ages "
                                  f"scaled): disk/live {ratio:.2f}x at the end (worst after pass 25 {worst:.2f}x), "
                                  f"snapshots ≤ {peak_snapshots}, manifests ≤ {peak_manifests}, {seconds:.0f} s; "
                                  + "; ".join(lines))
    assert peak_manifests <= 100, "manifests merged at commit.manifest.min-count-to-merge"
    assert peak_snapshots <= 60, "snapshots expired by age"
    assert ratio <= 1.3, f"bytes on disk {ratio:.2f}x the live table"
