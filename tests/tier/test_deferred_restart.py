"""A deferring view stopped at any record (its checkpoint written with what it had not applied yet), started again
and fed the rest, is the view that applies each record as it comes stopped and started at the same record: random
tiering passes, tombstones, keys taken by other segments' records (any partition), junk, purges, a writer's retries,
a partition deleted and its topic created again under the same name, partitions read by name between records."""

from __future__ import annotations

import asyncio
import logging
import random
from pathlib import Path
from typing import Any

import pytest

from tests.support.segments import Partition, one_pass, tp
from tests.tier.test_deferred import junk, reader, whole_view
from tests.tier.test_rlmm_replay import LogRLMM, Record
from tierproxy.tier.model import PartitionDeleteState as PD
from tierproxy.tier.model import RemoteLogStartOffset, RemotePartitionDeleteMetadata
from tierproxy.tier.serde import encode_value, record_key

LOG = Partition([7, 13, 5, 21, 9, 30, 2])


async def history(rng: random.Random) -> list[Record]:
    old, other, new = tp("t"), tp("u"), tp("t")  # `new`: topic t created again (another id)
    first, second = LogRLMM(), LogRLMM()
    for t in (old, other):
        for _ in range(rng.randint(1, 3)):
            await one_pass(first, t, LOG, rng.randint(1, 30), set(rng.sample(range(6), 1)), rng.randint(0, 1))
    log = list(first.log)
    if rng.random() < 0.7:
        for state in (PD.DELETE_PARTITION_MARKED, PD.DELETE_PARTITION_STARTED, PD.DELETE_PARTITION_FINISHED):
            pdm = RemotePartitionDeleteMetadata(old, state, 1, 1)
            log.append((record_key(pdm), encode_value(pdm)))
    for t in (new, other):
        await one_pass(second, t, LOG, rng.randint(1, 30), set(), 0)
    log += second.log
    keys = [k for k, v in log if v is not None]
    segment_values = [v for _, v in log if v is not None and v[0] == 0]
    out: list[Record] = []
    for i, record in enumerate(log):
        out.append(record)
        r = rng.random()
        if r < 0.08:
            out.append((rng.choice(keys), None))
        elif r < 0.12:
            out.append(junk(log, i, rng.randint(0, 2)))
        elif r < 0.15:
            event = RemoteLogStartOffset(rng.choice([old, new, other]), rng.randint(0, 100), 1)
            out.append((record_key(event), encode_value(event)))
        elif r < 0.18:
            out.append(record)
        elif r < 0.24:
            out.append((rng.choice(keys), rng.choice(segment_values)))
    return out


def fed(directory: Path, log: list[Record], cut: int, reads: set[int], *, deferring: bool) -> dict[str, Any]:
    """The view fed `log[:cut]`, stopped (its checkpoint written), started again from it and fed the rest."""
    views = [reader(directory, deferring=deferring)]
    for offset, (key, value) in enumerate(log):
        if offset == cut:
            views[-1].positions[0] = cut
            views[-1].write_checkpoint()
            views.append(reader(directory, deferring=deferring))
            assert views[-1].load_checkpoint() == {0: cut}
        views[-1]._apply(0, offset, key, value)
        if offset in reads:
            pc = views[-1].cache.find("t" if offset % 2 else "u", 0)
            if pc is not None:
                pc.earliest_offset()
    view = whole_view(views[-1])
    del view["figures"], view["consumed"]  # (counted per process: the restarted one's are its own)
    return view


@pytest.mark.parametrize("seed", [170, *range(20)])
def test_a_restarted_deferring_view_is_the_restarted_view_that_applies_at_once(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    log = asyncio.run(history(rng))
    cut = rng.randint(0, len(log) - 1)
    reads = set(rng.sample(range(len(log)), 5))
    logging.disable(logging.ERROR)  # (junk is logged as skipped, record by record)
    try:
        lazy = fed(tmp_path / "lazy", log, cut, reads, deferring=True)
        eager = fed(tmp_path / "eager", log, cut, reads, deferring=False)
    finally:
        logging.disable(logging.NOTSET)
    assert lazy == eager
