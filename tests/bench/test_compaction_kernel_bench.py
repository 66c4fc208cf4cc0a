"""The compaction engine's compiled kernel against its Python reference, in process, on generated data (issue 66).

1,000,000 records over 100,000 keys, ~100 B values, 5 % tombstones, in producer-like batches of 200 records
(uncompressed, then lz4), and 200,000 records in 1-record batches; cut into 20 segments. Per kernel: the map build
alone (`_build_map`), then a whole cleaning (`clean_partition`: its own map build, the producers, the filter and
the new segments); "clean" below is the whole cleaning less its map build. CPU seconds of this one thread
(`time.process_time`), so the figures are per core. numba's first compile (or cache load) is timed apart and not
counted.

Run: `flock /tmp/bench.lock pytest -m bench tests/bench/test_compaction_kernel_bench.py -s -p no:randomly`.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

import pytest

from protocol import compression
from protocol.records import Record, build_batch
from tests.bench.report import report
from tests.support.compaction import Tier
from tierproxy.jobs.tiering.compaction_kernel import CompiledKernel
from tierproxy.tier.compaction import CleanerConfig, CleaningPlan, SegmentInput, TierSegment, plan_cleaning
from tierproxy.tier.compaction.clean import _build_map, clean_partition
from tierproxy.tier.compaction.kernel import PYTHON, RecordKernel
from tierproxy.tier.compaction.offset_map import OffsetMap
from tierproxy.tier.compaction.producers import ProducerTracker

pytestmark = pytest.mark.bench

KEYS, VALUE = 100_000, 100
MAP_BYTES = 8 << 20  # room for the 100,000 keys (24 B a slot, 0.9 full)
NOW = 1_700_000_000_000


def _tier(records: int, per_batch: int, codec: int) -> tuple[Tier, int]:
    rng = random.Random(66)
    batches = []
    for base in range(0, records, per_batch):
        recs = [Record(o, NOW - 1000, b"key-%06d" % rng.randrange(KEYS),
                       None if rng.random() < 0.05 else rng.randbytes(VALUE)) for o in range(base, base + per_batch)]
        batches.append(build_batch(recs, base_offset=base, codec=codec))
    tier = Tier(CleanerConfig(min_cleanable_dirty_ratio=0.0))
    per_segment = -(-len(batches) // 20)
    for i in range(0, len(batches), per_segment):
        tier.append(batches[i:i + per_segment])
    return tier, sum(len(b) for b in batches)


def _plan(tier: Tier) -> tuple[CleaningPlan, Callable[[TierSegment], SegmentInput]]:
    plan = plan_cleaning([s for s, _ in tier.segments], NOW, tier.config)
    assert plan is not None
    inputs = {s.segment_id: i for s, i in tier.segments}
    return plan, lambda s: inputs[s.segment_id]


def _run(tier: Tier, kernel: RecordKernel) -> tuple[float, float]:
    """CPU seconds of the map build alone, and of a whole cleaning."""
    plan, read = _plan(tier)
    tracker = ProducerTracker(NOW, tier.config.producer_id_expiration_ms)
    t0 = time.process_time()
    _build_map(plan.segments, read, OffsetMap(MAP_BYTES), tracker, [], plan.first_dirty_offset,
               plan.first_uncleanable_offset, kernel)
    t1 = time.process_time()
    out = list(clean_partition(plan, read, NOW, tier.config, map_bytes=MAP_BYTES, kernel=kernel))
    t2 = time.process_time()
    assert out and all(c.cleaned for c in out)
    return t1 - t0, t2 - t1


def _logs(tier: Tier, kernel: RecordKernel) -> list[bytes]:
    plan, read = _plan(tier)
    out = clean_partition(plan, read, NOW, tier.config, map_bytes=MAP_BYTES, kernel=kernel)
    return [b"".join(bytes(p) for p in c.files.log_parts) if c.files else b"" for c in out]


@pytest.mark.parametrize(("records", "per_batch", "codec"), [(1_000_000, 200, compression.NONE),
                                                             (1_000_000, 200, compression.LZ4),
                                                             (200_000, 1, compression.NONE)])
def test_compiled_kernel_against_python(records: int, per_batch: int, codec: int) -> None:
    tier, size = _tier(records, per_batch, codec)
    compiled = CompiledKernel()
    t0 = time.perf_counter()
    small, _ = _tier(400, per_batch, codec)
    _run(small, compiled)  # numba's compile, or its cache's load
    first = time.perf_counter() - t0
    name = f"compaction kernel, {records:,} records in {per_batch}-record batches, {compression.NAMES[codec]}"
    figures = {}
    for label, kernel in (("python", PYTHON), ("compiled", compiled)):
        figures[label] = _run(tier, kernel)
    for i, phase in enumerate(("map build", "clean")):
        py, c = figures["python"][i], figures["compiled"][i]
        report(f"{name}: {phase}", f"python {records / py:,.0f} rec/s {size / py / 1e6:.1f} MB/s; compiled "
               f"{records / c:,.0f} rec/s {size / c / 1e6:.1f} MB/s per core; {py / c:.1f}x")
    report(f"{name}: first call (compile or cache load)", f"{first:.2f} s")
    assert figures["compiled"][0] < figures["python"][0] and figures["compiled"][1] < figures["python"][1]
    assert _logs(tier, compiled) == _logs(tier, PYTHON)
