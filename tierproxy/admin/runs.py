"""Tiering passes asked for through the admin API: recorded in the remote log metadata (`TierPass`), run by the
running tier job with its own configuration, one at a time."""

from __future__ import annotations

import time
import uuid

from fastapi import HTTPException

from tierproxy.admin.models import TieringRun
from tierproxy.proxy.server import Proxy
from tierproxy.tier.model import TierPass


async def request_pass(proxy: Proxy) -> TieringRun:
    """Record a request for a pass now; 409 while one is pending or when there is no metadata here."""
    rlmm = proxy.remote.rlmm if proxy.remote is not None and proxy.remote.ready.is_set() else None
    if rlmm is None:
        raise HTTPException(409, "no remote log metadata here (storage not set, or still loading)")
    await rlmm.catch_up()
    pending = rlmm.cache.pass_pending()
    if pending is not None:
        raise HTTPException(409, f"a tiering pass is already asked for: run {pending.request_id}")
    asked = TierPass(uuid.uuid4().hex[:12], True, int(time.time() * 1000))
    await rlmm.put_tier_pass(asked)
    return run_of(asked, None)


def run_status(proxy: Proxy, run_id: str) -> TieringRun:
    """The latest requested pass (404 for any other id)."""
    cache = proxy.remote.rlmm.cache if proxy.remote is not None else None
    asked = cache.pass_requested if cache is not None else None
    if cache is None or asked is None or asked.request_id != run_id:
        raise HTTPException(404, f"unknown run {run_id!r} (only the latest is kept)")
    done = cache.pass_done
    return run_of(asked, done if done is not None and done.request_id == run_id else None)


def run_of(asked: TierPass, done: TierPass | None) -> TieringRun:
    if done is None:
        return TieringRun(run_id=asked.request_id, status="requested", started_ms=asked.event_timestamp_ms,
                          finished_ms=None, summary=None, returncode=None)
    return TieringRun(run_id=asked.request_id, status="succeeded" if done.returncode == 0 else "failed",
                      started_ms=asked.event_timestamp_ms, finished_ms=done.event_timestamp_ms, summary=done.summary,
                      returncode=done.returncode)
