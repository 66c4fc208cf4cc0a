"""Tiering passes asked for through the admin API: recorded in the remote log metadata (`TierPass`), run by the
running tier job with its own configuration, one at a time.

A request waits `wait_ms` for a tier job to take it, then expires (`MetadataCache.pass_pending`), and its asker
may withdraw it sooner: an abandoned request never blocks a later one, and no job runs it long after."""

from __future__ import annotations

import time
import uuid

from fastapi import HTTPException

from tierproxy.admin.models import TieringRun
from tierproxy.proxy.server import Proxy
from tierproxy.tier.model import PassStage, TierPass
from tierproxy.tier.rlmm import RemoteLogMetadataManager

DEFAULT_WAIT_MS = 60_000  # how long a request waits for a tier job to take it (the job looks every second)


def _now_ms() -> int:
    return int(time.time() * 1000)


async def _rlmm(proxy: Proxy) -> RemoteLogMetadataManager:
    rlmm = proxy.remote.rlmm if proxy.remote is not None and proxy.remote.ready.is_set() else None
    if rlmm is None:
        raise HTTPException(409, "no remote log metadata here (storage not set, or still loading)")
    await rlmm.catch_up()
    return rlmm


async def request_pass(proxy: Proxy, wait_ms: int = DEFAULT_WAIT_MS, now_ms: int | None = None) -> TieringRun:
    """Record a request for a pass now, for a tier job to take within `wait_ms`; 409 while another is to be taken,
    or when there is no metadata here."""
    rlmm = await _rlmm(proxy)
    now = _now_ms() if now_ms is None else now_ms
    pending = rlmm.cache.pass_pending(now)
    if pending is not None:
        left = f", or it expires in {max(0, pending.expires_ms - now) // 1000} s" if pending.expires_ms >= 0 else ""
        raise HTTPException(409, f"a tiering pass is already asked for: run {pending.request_id} (a tier job takes "
                            f"it{left}; DELETE /v1/tiering/runs/{pending.request_id} withdraws it)")
    asked = TierPass(uuid.uuid4().hex[:12], True, now, expires_ms=now + wait_ms)
    await rlmm.put_tier_pass(asked)
    return run_of(asked, None, now)


async def withdraw_pass(proxy: Proxy, run_id: str, now_ms: int | None = None) -> TieringRun:
    """Withdraw a request no tier job has taken (its asker stopped waiting); 409 once a job took it (404 for an id
    that is not the latest request). Withdrawing a withdrawn or expired request changes nothing."""
    rlmm = await _rlmm(proxy)
    now = _now_ms() if now_ms is None else now_ms
    asked, done = _latest(rlmm, run_id)
    if done is not None and done.stage != PassStage.WITHDRAWN:
        raise HTTPException(409, f"run {run_id} was taken by a tier job: {run_of(asked, done, now).status}")
    if done is None:
        done = TierPass(run_id, False, now, "withdrawn: no tier job took it", 0, stage=PassStage.WITHDRAWN)
        await rlmm.put_tier_pass(done)
    return run_of(asked, done, now)


def _latest(rlmm: RemoteLogMetadataManager, run_id: str) -> tuple[TierPass, TierPass | None]:
    asked = rlmm.cache.pass_requested
    if asked is None or asked.request_id != run_id:
        raise HTTPException(404, f"unknown run {run_id!r} (only the latest is kept)")
    done = rlmm.cache.pass_done
    return asked, done if done is not None and done.request_id == run_id else None


def run_status(proxy: Proxy, run_id: str, now_ms: int | None = None) -> TieringRun:
    """The latest requested pass (404 for any other id)."""
    if proxy.remote is None:
        raise HTTPException(404, f"unknown run {run_id!r} (only the latest is kept)")
    asked, done = _latest(proxy.remote.rlmm, run_id)
    return run_of(asked, done, _now_ms() if now_ms is None else now_ms)


def run_of(asked: TierPass, done: TierPass | None, now_ms: int) -> TieringRun:
    """`requested` (no job took it yet), `expired` (none did in time), `withdrawn`, `running` (a job took it),
    then `succeeded` or `failed`."""
    expires = asked.expires_ms if asked.expires_ms >= 0 else None
    if done is None:
        status = "expired" if expires is not None and expires <= now_ms else "requested"
        return TieringRun(run_id=asked.request_id, status=status, started_ms=asked.event_timestamp_ms,
                          finished_ms=None, summary=None, returncode=None, expires_ms=expires)
    if done.stage != PassStage.FINISHED:
        status = "running" if done.stage == PassStage.TAKEN else "withdrawn"
        return TieringRun(run_id=asked.request_id, status=status, started_ms=asked.event_timestamp_ms,
                          finished_ms=None if status == "running" else done.event_timestamp_ms,
                          summary=done.summary, returncode=None, expires_ms=expires)
    return TieringRun(run_id=asked.request_id, status="succeeded" if done.returncode == 0 else "failed",
                      started_ms=asked.event_timestamp_ms, finished_ms=done.event_timestamp_ms, summary=done.summary,
                      returncode=done.returncode, expires_ms=expires)
