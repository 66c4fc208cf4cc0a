"""`tier.ownership`: a restore in progress (hand-over written, mounts not yet) refuses the tier job, and only it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tierproxy.tier.ownership import (
    RestoreInProgress,
    WrongCluster,
    check_cluster,
    hand_over,
    recorded_owner,
    restore_finished,
)
from tierproxy.tier.rsm import RemoteStorageManager


def test_between_hand_over_and_mounts_only_the_tier_job_is_refused(tmp_path: Path) -> None:
    async def go() -> None:
        rsm = RemoteStorageManager.from_uri(f"file://{tmp_path}/tier")
        try:
            await check_cluster(rsm, "A", record=True, brokers="a:9092")  # A's first pass records it
            await hand_over(rsm, await recorded_owner(rsm), "B", "A", now_ms=5)
            with pytest.raises(RestoreInProgress, match="restore of cluster A into cluster B is in progress"):
                await check_cluster(rsm, "B", record=True, brokers="b:9092")
            await check_cluster(rsm, "B", record=False, brokers="b:9092")  # serve, iceberg: not a pass
            with pytest.raises(WrongCluster, match="restored from cluster A onto cluster B"):
                await check_cluster(rsm, "A", record=False, brokers="a:9092")
            await restore_finished(rsm, "B")
            await check_cluster(rsm, "B", record=True, brokers="b:9092")
            owner = await recorded_owner(rsm)
            assert owner is not None and owner.restoring is None and owner.lineage_ids == ["A"]
            # a later stage says it again, the lineage unchanged
            await hand_over(rsm, owner, "B", "A", now_ms=9)
            with pytest.raises(RestoreInProgress):
                await check_cluster(rsm, "B", record=True, brokers="b:9092")
            assert (again := await recorded_owner(rsm)) is not None and again.lineage_ids == ["A"]
        finally:
            await rsm.close()

    asyncio.run(go())


def test_a_tier_that_recorded_no_owner_is_handed_over_with_the_source_in_its_lineage(tmp_path: Path) -> None:
    async def go() -> None:
        rsm = RemoteStorageManager.from_uri(f"file://{tmp_path}/tier")
        try:
            await hand_over(rsm, None, "B", "A")
            with pytest.raises(WrongCluster, match="restored from cluster A"):
                await check_cluster(rsm, "A", record=True, brokers="a:9092")
        finally:
            await rsm.close()

    asyncio.run(go())
